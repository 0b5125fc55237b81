"""Bulk actions shared by many tenants, on an in-process node against real PostgreSQL and
RabbitMQ: counts that stop at a cap, reads that give way (429) or time out (422) before they
hold the pool, a batch past its time failing its action and not the node's readiness, budgets
per namespace with an operator's apart, ended actions removed, and fair turns between
namespaces."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx

from tests.support.nodes import bearer, client, running_node
from tests.support.waiting import until

ADMIN = "admin-token-0123456789"
TEAM_A = "team-a-token-0123456789"
TEAM_B = "team-b-token-0123456789"
KEYS = f"{ADMIN}:admin,{TEAM_A}:producer:a,{TEAM_B}:producer:b"
FAR = "2030-01-01T00:00:00Z"


@asynccontextmanager
async def served(
    database_url: str, amqp_url: str, **more: object
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a node with the tenants' keys and these settings."""
    async with (
        running_node(
            database_url=database_url,
            amqp_url=amqp_url,
            node_id="bulk-bounds",
            shard_count=4,
            api_keys=KEYS,
            bulk_poll_s=0.2,
            **more,
        ) as node,
        client(node) as http,
    ):
        yield http


async def submit(http: httpx.AsyncClient, token: str, count: int, **job: Any) -> None:
    for start in range(0, count, 1000):
        size = min(1000, count - start)
        body = {"jobs": [{"routing_key": "r.k", "payload": 1, "run_at": FAR, **job}] * size}
        made = await http.post("/v1/jobs/batch", json=body, headers=bearer(token))
        assert made.status_code == 201, made.text


async def make(http: httpx.AsyncClient, token: str, **body: Any) -> httpx.Response:
    document = {"action": "cancel", "filter": {"state": "scheduled"}, **body}
    return await http.post("/v1/bulk-actions", json=document, headers=bearer(token))


async def status(http: httpx.AsyncClient, token: str, action_id: str) -> str:
    found = await http.get(f"/v1/bulk-actions/{action_id}", headers=bearer(token))
    return str(found.json()["status"]) if found.status_code == 200 else str(found.status_code)


async def test_a_dry_run_counts_up_to_the_cap_and_says_at_least(
    database_url: str, amqp_url: str
) -> None:
    async with served(database_url, amqp_url, bulk_count_cap=50) as http:
        await submit(http, TEAM_A, 120)
        await submit(http, TEAM_B, 30)
        capped = await make(http, TEAM_A, dry_run=True)
        exact = await make(http, TEAM_B, dry_run=True)
        made = await make(http, TEAM_A)
    assert (capped.json()["matched"], capped.json()["matched_at_least"]) == (50, True)
    assert (exact.json()["matched"], exact.json()["matched_at_least"]) == (30, False)
    assert made.json()["matched_estimate"] == 50


async def test_counts_past_the_nodes_share_answer_429_and_a_slow_one_422_naming_the_filter(
    database_url: str, amqp_url: str
) -> None:
    async with served(database_url, amqp_url, bulk_reads=1) as http:
        await submit(http, TEAM_A, 5000)
        answers = await asyncio.gather(*(make(http, TEAM_A, dry_run=True) for _ in range(12)))
        codes = sorted(answer.status_code for answer in answers)
        busy = [answer for answer in answers if answer.status_code == 429]
        healthy = await http.get("/healthz")
    assert codes[0] == 200, codes
    assert busy, codes
    assert set(codes) == {200, 429}
    assert all(answer.headers["retry-after"] == "1" for answer in busy)
    assert healthy.status_code == 200

    async with served(database_url, amqp_url, bulk_read_timeout_s=0.001) as http:
        slow = await make(
            http, TEAM_A, dry_run=True, filter={"state": "scheduled", "error_contains": "x"}
        )
        before = (await http.get("/v1/bulk-actions", headers=bearer(TEAM_A))).json()
    assert slow.status_code == 422, slow.text
    assert slow.json()["fields"][0]["field"] == "filter"
    assert before["bulk_actions"] == []


async def test_a_batch_past_its_time_fails_its_action_and_the_node_stays_ready(
    database_url: str, amqp_url: str
) -> None:
    """A job locked by another transaction holds the batch past its time: the action fails with
    that reason, and /readyz, which used to answer 503 while the batch was retried for ever,
    stays 200."""
    holder = await asyncpg.connect(database_url)
    try:
        async with served(database_url, amqp_url, bulk_batch_timeout_s=1.0) as http:
            await submit(http, TEAM_A, 10)
            lock = holder.transaction()
            await lock.start()
            await holder.execute("SELECT FROM jobs ORDER BY id LIMIT 1 FOR UPDATE")
            made = (await make(http, TEAM_A)).json()
            readiness = []

            async def failed() -> bool:
                readiness.append((await http.get("/readyz", headers=bearer(ADMIN))).status_code)
                return await status(http, TEAM_A, made["id"]) == "failed"

            await until(failed, deadline_s=15)
            await lock.rollback()
            found = (
                await http.get(f"/v1/bulk-actions/{made['id']}", headers=bearer(TEAM_A))
            ).json()
    finally:
        await holder.close()
    assert "took over 1 s" in found["reason"]
    assert set(readiness) == {200}


async def test_each_namespace_has_its_budget_and_an_operators_is_apart(
    database_url: str, amqp_url: str
) -> None:
    """Probed: namespace a's actions used up every namespace's room. Now each namespace (and the
    operator) has its own: b at its caps is refused 409 naming the action; a and the admin are
    not; a stopped action is resumed only within the running cap."""
    bounds = {"bulk_max_running": 2, "bulk_max_stored": 3, "bulk_batch": 1, "bulk_rate_per_s": 0.2}
    async with served(database_url, amqp_url, **bounds) as http:
        await submit(http, TEAM_B, 20)
        first, second = [(await make(http, TEAM_B)).json() for _ in range(2)]
        over = await make(http, TEAM_B)
        others = [await make(http, TEAM_A), await make(http, ADMIN), await make(http, ADMIN)]
        stopped = await http.post(f"/v1/bulk-actions/{first['id']}/stop", headers=bearer(TEAM_B))
        third = await make(http, TEAM_B)
        stored_over = await make(http, TEAM_B)
        resumed = await http.post(f"/v1/bulk-actions/{first['id']}/resume", headers=bearer(TEAM_B))
        listed = (await http.get("/v1/bulk-actions", headers=bearer(TEAM_B))).json()
    assert over.status_code == 409, over.text
    assert over.json()["fields"][0]["field"] == "action"
    assert "RUNNING" in over.json()["message"]
    assert [answer.status_code for answer in others] == [202, 202, 202]
    assert (stopped.status_code, third.status_code) == (200, 202)
    assert stored_over.status_code == 409
    assert "STORED" in stored_over.json()["message"]
    assert resumed.status_code == 409  # two of b's are running
    assert sorted(a["status"] for a in listed["bulk_actions"]) == ["running", "running", "stopped"]
    assert second["status"] == "running"


async def test_ended_actions_are_removed_after_their_keeping_time(
    database_url: str, amqp_url: str
) -> None:
    async with served(database_url, amqp_url, bulk_keep_s=1.0) as http:
        await submit(http, TEAM_A, 3)
        made = (await make(http, TEAM_A)).json()
        await until(lambda: _is(http, made["id"], "done"), deadline_s=10)
        await until(lambda: _is(http, made["id"], "404"), deadline_s=10)


async def _is(http: httpx.AsyncClient, action_id: str, expected: str) -> bool:
    return await status(http, TEAM_A, action_id) == expected


async def test_an_operators_action_and_another_namespaces_never_wait_behind_a_tenants(
    database_url: str, amqp_url: str
) -> None:
    """Probed: eight reschedules by namespace b held an admin's one-job cancel running for over
    30 s. Batches now take turns: the operator's first, then the namespaces in turn."""
    pace = {"bulk_batch": 50, "bulk_rate_per_s": 500.0, "bulk_max_running": 8}
    async with served(database_url, amqp_url, **pace) as http:
        await submit(http, TEAM_B, 8000, routing_key="b.k")
        await submit(http, TEAM_A, 1, routing_key="a.k")
        tenants = [
            (await make(http, TEAM_B, action="reschedule", shift_s=60)).json() for _ in range(8)
        ]
        await asyncio.sleep(0.5)  # b's actions are under way
        started = time.monotonic()
        admins = await make(http, ADMIN, filter={"state": "scheduled", "routing_key": "a.k"})
        theirs = await make(http, TEAM_A, filter={"state": "scheduled", "routing_key": "a.k"})
        await until(lambda: _done(http, ADMIN, admins.json()["id"]), deadline_s=20)
        admin_s = time.monotonic() - started
        await until(lambda: _done(http, TEAM_A, theirs.json()["id"]), deadline_s=20)
        tenant_s = time.monotonic() - started
        still = [await status(http, TEAM_B, action["id"]) for action in tenants]
    assert admin_s < 2.0, admin_s
    assert tenant_s < 4.0, tenant_s
    assert "running" in still  # b's were not done first: they took turns


async def _done(http: httpx.AsyncClient, token: str, action_id: str) -> bool:
    return await status(http, token, action_id) == "done"
