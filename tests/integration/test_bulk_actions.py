"""Bulk actions on an in-process node, against real PostgreSQL and RabbitMQ: a ledger for each
action (every matching job changed exactly once, with a history step naming the action, nothing
else touched), stop and resume, a repeat that changes nothing more, a worker's lease taken over,
a cancel racing with firing, scopes, and refused input that changes nothing."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from consumers_sdk import DispatcherClient
from consumers_sdk.errors import BulkActionConflict, InvalidBulkAction
from devstack.collector import Collector
from dispatcher.node import Node
from tests.support.nodes import client, running_node
from tests.support.stored_events import STORED_EVENTS
from tests.support.waiting import until

ADMIN = "admin-token-0123456789"
BILLING = "billing-token-0123456789"  # a producer of namespace team-a, billing.* only
FAR = "2030-01-01T00:00:00Z"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="bulk-test",
        shard_count=8,
        api_keys=f"{ADMIN}:admin,{BILLING}:producer:team-a:billing",
        bulk_batch=40,  # several batches for a few hundred jobs
        bulk_poll_s=0.2,
        bulk_lease_s=2.0,
        # The safety sweep would find overdue jobs 15 s late; this far out, a requeued or
        # rescheduled job fires in time only through the catch-up cursor or a due notice.
        sweep_grace_s=300.0,
        # These tests start actions back to back, and each counts its jobs first: after a count
        # a node rests three times what it took by default, which a loaded machine lengthens
        # past the wait a request is given (then 429). The gate is tests/unit/test_read_gate.py's.
        bulk_read_duty=1.0,
        bulk_reads_per_s=1000.0,
    ) as running:
        yield running


@pytest.fixture
async def http(node: Node) -> AsyncIterator[httpx.AsyncClient]:
    async with client(node) as api:
        api.headers.update(bearer(ADMIN))
        yield api


@pytest.fixture
async def sql(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    yield connection
    await connection.close()


async def submit(http: httpx.AsyncClient, count: int, token: str = ADMIN, **job: Any) -> list[str]:
    """``count`` jobs (far in the future unless told), their ids in order."""
    body = {"jobs": [{"payload": n, "run_at": FAR, **job} for n in range(count)]}
    response = await http.post("/v1/jobs/batch", json=body, headers=bearer(token))
    assert response.status_code == 201, response.text
    return [created["id"] for created in response.json()["jobs"]]


async def kill(sql: asyncpg.Connection, ids: list[str], error: str) -> None:
    """Make jobs dead as a consumer's last failure would (dispatched, then dead)."""
    await sql.execute(
        "UPDATE jobs SET state = 'dead', last_error = $2, dispatched_at = now(),"
        " updated_at = now() WHERE id = ANY($1::uuid[])",
        ids,
        error,
    )


async def started(http: httpx.AsyncClient, token: str = ADMIN, **body: Any) -> dict[str, Any]:
    response = await http.post("/v1/bulk-actions", json=body, headers=bearer(token))
    assert response.status_code == 202, response.text
    action: dict[str, Any] = response.json()
    assert action["status"] == "running"
    return action


async def finished(http: httpx.AsyncClient, action_id: str, deadline_s: float = 30) -> Any:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = (await http.get(f"/v1/bulk-actions/{action_id}")).json()
        if found["status"] != "running":
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"bulk action {action_id} still running: {found}")


async def steps(sql: asyncpg.Connection, detail: str) -> dict[str, list[str]]:
    """Job id -> the outcomes of its history steps whose detail starts with ``detail``."""
    rows = await sql.fetch(
        f"SELECT job_id::text AS id, outcome FROM {STORED_EVENTS} WHERE starts_with(detail, $1)",
        detail,
    )
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["id"], []).append(row["outcome"])
    return found


async def states(sql: asyncpg.Connection) -> dict[str, tuple[str, datetime]]:
    rows = await sql.fetch("SELECT id::text AS id, state, run_at FROM jobs")
    return {row["id"]: (row["state"], row["run_at"]) for row in rows}


async def test_a_bulk_requeue_changes_each_matching_job_once_and_nothing_else(
    node: Node, http: httpx.AsyncClient, sql: asyncpg.Connection, collector: Collector
) -> None:
    matching = await submit(http, 230, routing_key="billing.charge")
    other_error = await submit(http, 15, routing_key="billing.charge")
    other_key = await submit(http, 15, routing_key="mail.send")
    pending = await submit(http, 15, routing_key="billing.charge")
    await kill(sql, matching, "HTTP 503 from the bank: Timeout")
    await kill(sql, other_error, "card declined")
    await kill(sql, other_key, "timeout")
    before = await states(sql)
    body = {
        "action": "requeue",
        "filter": {"routing_key_prefix": "billing", "error_contains": "TIMEOUT"},
    }

    dry = await http.post("/v1/bulk-actions", json={**body, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert dry.json()["matched"] == 230
    assert [job["id"] for job in dry.json()["sample"]] == sorted(matching)[:20]
    assert await states(sql) == before  # a dry run changes nothing

    action = await started(http, **body)
    assert action["matched_estimate"] == 230
    done = await finished(http, action["id"])
    assert (done["status"], done["touched"]) == ("done", 230)

    ledger = await steps(sql, f"bulk action {action['id']}: requeue")
    assert ledger == {job_id: ["requeued"] for job_id in matching}
    exposed = (await http.get("/metrics")).text
    assert 'dispatcher_bulk_jobs_changed_total{action="requeue"} 230.0' in exposed
    after = await states(sql)
    for job_id in other_error + other_key + pending:
        assert after[job_id] == before[job_id]
    # Requeued due now, they fire promptly from the catch-up lane, each once.
    assert await collector.wait_for(matching, 5) == set()
    assert not set(collector.deliveries) & set(other_error + other_key + pending)

    # The history shows the step with its action, after the dispatch it replaced.
    document = (await http.get(f"/v1/jobs/{matching[0]}")).json()
    events = [(step["event"], step.get("detail")) for step in document["history"]]
    assert events[:3] == [
        ("scheduled", None),
        ("dispatched", None),
        ("requeued", f"bulk action {action['id']}: requeue"),
    ]

    # The same action again finds nothing left to change.
    again = await finished(http, (await started(http, **body))["id"])
    assert (again["status"], again["touched"]) == ("done", 0)


async def test_a_bulk_cancel_racing_with_firing_never_fires_a_job_it_cancelled(
    node: Node, http: httpx.AsyncClient, sql: asyncpg.Connection, collector: Collector
) -> None:
    now = datetime.now(UTC)
    ids: list[str] = []
    for chunk in range(4):  # due over the next two seconds, while the cancel runs
        body = {
            "jobs": [
                {
                    "routing_key": "race.cancel",
                    "payload": n,
                    "run_at": (
                        now + timedelta(milliseconds=300 + 5 * (chunk * 100 + n))
                    ).isoformat(),
                }
                for n in range(100)
            ]
        }
        response = await http.post("/v1/jobs/batch", json=body)
        assert response.status_code == 201, response.text
        ids += [job["id"] for job in response.json()["jobs"]]
    await asyncio.sleep(0.4)
    action = await started(http, action="cancel", filter={"routing_key": "race.cancel"})
    done = await finished(http, action["id"])
    await asyncio.sleep(3)  # every job not cancelled is due and fired by now
    await collector.settle(0.5)

    ledger = await steps(sql, f"bulk action {action['id']}: cancel")
    after = await states(sql)
    cancelled = {job_id for job_id in ids if after[job_id][0] == "cancelled"}
    assert cancelled == set(ledger)  # every cancel is the action's, with one step each
    assert all(outcomes == ["cancelled"] for outcomes in ledger.values())
    assert done["touched"] == len(cancelled)
    assert not cancelled & set(collector.deliveries)  # a cancelled job never fired
    fired = set(ids) - cancelled
    assert await collector.wait_for(fired, 10) == set()
    assert all(after[job_id][0] == "dispatched" for job_id in fired)
    assert cancelled, "the cancel came too late to race with anything"

    # Its history ends in one cancelled step, the action's.
    document = (await http.get(f"/v1/jobs/{min(cancelled)}")).json()
    assert [(s["event"], s.get("detail")) for s in document["history"]][1:] == [
        ("cancelled", f"bulk action {action['id']}: cancel")
    ]


async def test_a_stopped_reschedule_resumes_where_it_stopped_and_moves_each_job_once(
    node: Node, http: httpx.AsyncClient, sql: asyncpg.Connection
) -> None:
    ids = await submit(http, 600, routing_key="moved.later", run_at="2029-01-01T00:00:00Z")
    untouched = await submit(http, 10, routing_key="moved.not")
    before = await states(sql)
    # Slow it down: after each batch of 40, a rest of 19 times its time (at most a quarter of
    # the lease: 0.5 s).
    node.bulk.runner._rest = 19.0
    action = await started(
        http, action="reschedule", filter={"routing_key": "moved.later"}, shift_s=3600
    )
    deadline = time.monotonic() + 20
    while (await http.get(f"/v1/bulk-actions/{action['id']}")).json()["touched"] == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    stopped = await http.post(f"/v1/bulk-actions/{action['id']}/stop")
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["status"] == "stopped"
    touched = stopped.json()["touched"]
    assert 0 < touched < 600
    await asyncio.sleep(1)
    still = (await http.get(f"/v1/bulk-actions/{action['id']}")).json()
    assert (still["status"], still["touched"]) == ("stopped", touched)
    assert (await http.post(f"/v1/bulk-actions/{action['id']}/stop")).status_code == 409

    node.bulk.runner._rest = 0.0
    resumed = await http.post(f"/v1/bulk-actions/{action['id']}/resume")
    assert resumed.status_code == 200, resumed.text
    done = await finished(http, action["id"])
    assert (done["status"], done["touched"]) == ("done", 600)

    after = await states(sql)
    ledger = await steps(sql, f"bulk action {action['id']}: reschedule")
    assert ledger == {job_id: ["rescheduled"] for job_id in ids}
    for job_id in ids:
        assert after[job_id] == ("scheduled", before[job_id][1] + timedelta(hours=1))
    for job_id in untouched:
        assert after[job_id] == before[job_id]


async def test_jobs_rescheduled_into_the_loaded_window_fire_at_their_new_time(
    node: Node, http: httpx.AsyncClient, collector: Collector
) -> None:
    ids = await submit(http, 120, routing_key="moved.sooner")  # far beyond the window
    soon = datetime.now(UTC) + timedelta(seconds=1.5)
    action = await started(
        http,
        action="reschedule",
        filter={"routing_key": "moved.sooner"},
        run_at=soon.isoformat(),
    )
    assert (await finished(http, action["id"]))["touched"] == 120
    assert await collector.wait_for(ids, 8) == set()
    assert all(
        delivery.received_at >= soon.timestamp()
        for job_id in ids
        for delivery in collector.deliveries[job_id]
    )


async def test_an_action_whose_worker_died_is_taken_over_after_its_lease(
    node: Node, http: httpx.AsyncClient, sql: asyncpg.Connection
) -> None:
    ids = await submit(http, 100, routing_key="orphan.cancel")
    # Made and taken by another node, which died at once: its lease runs two more seconds.
    action_id = uuid.uuid4()
    await sql.execute(
        "INSERT INTO bulk_actions (id, action, states, routing_key, created_by, worked_by,"
        " lease_until) VALUES ($1, 'cancel', '{scheduled,waiting}', 'orphan.cancel', 'admin',"
        " 'dead-node', now() + interval '2 s')",
        action_id,
    )
    node.bulk.runner.wake()
    await asyncio.sleep(1)
    assert (await http.get(f"/v1/bulk-actions/{action_id}")).json()["touched"] == 0
    done = await finished(http, str(action_id))
    assert (done["status"], done["touched"]) == ("done", 100)
    assert set(await steps(sql, f"bulk action {action_id}")) == set(ids)


async def test_a_producer_acts_only_within_its_namespace_and_prefixes(
    node: Node, http: httpx.AsyncClient, sql: asyncpg.Connection
) -> None:
    own = await submit(http, 5, token=BILLING, routing_key="billing.invoice")
    other_namespace = await submit(http, 5, routing_key="billing.invoice")  # the default one
    before = await states(sql)
    denied = await http.post(
        "/v1/bulk-actions", json={"action": "requeue"}, headers=bearer(BILLING)
    )
    assert denied.status_code == 403, denied.text
    outside = await http.post(
        "/v1/bulk-actions",
        json={"action": "cancel", "filter": {"routing_key": "mail.send"}},
        headers=bearer(BILLING),
    )
    assert outside.status_code == 403, outside.text
    action = await started(http, token=BILLING, action="cancel")
    assert action["filter"]["namespace"] == "team-a"
    done = await finished(http, action["id"])
    assert done["touched"] == 5
    after = await states(sql)
    assert {job_id for job_id in own if after[job_id][0] == "cancelled"} == set(own)
    assert all(after[job_id] == before[job_id] for job_id in other_namespace)
    listed = (await http.get("/v1/bulk-actions", headers=bearer(BILLING))).json()
    assert [found["id"] for found in listed["bulk_actions"]] == [action["id"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "cancel", "filter": {"state": "dead"}}, "filter.state"),
        ({"action": "requeue", "filter": {"state": "scheduled"}}, "filter.state"),
        ({"action": "reschedule"}, "run_at"),
        ({"action": "reschedule", "run_at": FAR, "shift_s": 5}, "run_at"),
        ({"action": "reschedule", "shift_s": 0}, "shift_s"),
        ({"action": "cancel", "shift_s": 60}, "shift_s"),
        ({"action": "cancel", "filter": {"finished_from": FAR}}, "filter.finished_from"),
        (
            {
                "action": "cancel",
                "filter": {"run_at_from": FAR, "run_at_to": "2029-01-01T00:00:00Z"},
            },
            "filter.run_at_to",
        ),
        (
            {"action": "cancel", "filter": {"routing_key_prefix": "a b"}},
            "filter.routing_key_prefix",
        ),
        ({"action": "cancel", "filter": {"error_contains": ""}}, "filter.error_contains"),
    ],
)
async def test_bad_input_answers_422_naming_the_field_and_changes_nothing(
    node: Node,
    http: httpx.AsyncClient,
    sql: asyncpg.Connection,
    body: dict[str, Any],
    field: str,
) -> None:
    await submit(http, 3, routing_key="kept.as.is")
    before = await states(sql)
    response = await http.post("/v1/bulk-actions", json=body)
    assert response.status_code == 422, response.text
    assert field in [named["field"] for named in response.json().get("fields", [])], response.text
    assert await sql.fetchval("SELECT count(*) FROM bulk_actions") == 0
    assert await states(sql) == before


async def test_the_sdk_client_dry_runs_starts_and_follows_a_bulk_action(
    node: Node, http: httpx.AsyncClient, sql: asyncpg.Connection
) -> None:
    ids = await submit(http, 7, routing_key="sdk.cancel")
    async with DispatcherClient(
        "http://127.0.0.1", api_key=ADMIN, transport=httpx.ASGITransport(app=node.serving.app)
    ) as dispatcher:
        dry = await dispatcher.bulk.dry_run("cancel", filter={"routing_key": "sdk.cancel"})
        assert (dry.matched, [job.id for job in dry.sample]) == (7, sorted(ids))
        action = await dispatcher.bulk.start("cancel", filter={"routing_key": "sdk.cancel"})

        async def action_ended() -> bool:
            return not (await dispatcher.bulk.get(action.id)).running

        await until(action_ended, 30)
        action = await dispatcher.bulk.get(action.id)
        assert (action.status, action.touched, action.matched_estimate) == ("done", 7, 7)
        assert [found.id for found in await dispatcher.bulk.list()] == [action.id]
        with pytest.raises(BulkActionConflict):
            await dispatcher.bulk.stop(action.id)
        with pytest.raises(InvalidBulkAction) as invalid:
            await dispatcher.bulk.start("reschedule", filter={"routing_key": "sdk.cancel"})
        assert invalid.value.body["fields"][0]["field"] == "run_at"  # type: ignore[index]
    assert set(await steps(sql, f"bulk action {action.id}: cancel")) == set(ids)


async def test_actions_are_listed_newest_first(http: httpx.AsyncClient) -> None:
    made = []
    for n in range(5):  # each ended before the next: a node runs at most 4 at once
        made.append(
            (await started(http, action="cancel", filter={"routing_key": f"none.{n}"}))["id"]
        )
        await finished(http, made[-1])
    listed = (await http.get("/v1/bulk-actions")).json()["bulk_actions"]
    assert [found["id"] for found in listed] == made[::-1]
