"""PATCH /v1/jobs/{id} on an in-process node, against real PostgreSQL and RabbitMQ: a job fires at
its new time only, whoever moved it, and a reschedule or cancel racing with firing has one answer
that matches what was delivered."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson
import pytest

from devstack.collector import Collector
from dispatcher import models
from dispatcher.node import Node
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore
from tests.support.nodes import client, running_node

# The safety sweep would also find a job moved into the loaded window, 15 s late; with it this
# far out, only the due notice can make such a job fire within the tests' deadlines.
NO_SWEEP_S = 300.0


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="reschedule-test",
        shard_count=16,
        sweep_grace_s=NO_SWEEP_S,
        db_timeout_s=15,  # the race test's burst of requests queues for the pool on a busy box
    ) as running:
        yield running


def at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


async def submit(node: Node, **job: object) -> dict[str, object]:
    async with client(node) as http:
        response = await http.post("/v1/jobs", json={"routing_key": "moved.a", **job})
    assert response.status_code == 201, response.text
    created: dict[str, object] = response.json()
    return created


async def test_a_job_moved_later_fires_at_the_new_time_only(
    node: Node, collector: Collector
) -> None:
    job = await submit(node, payload=1, delay_ms=800)
    assert node.firing.lanes.live_count == 1  # in memory at the old time
    async with client(node) as http:
        moved = await http.patch(f"/v1/jobs/{job['id']}", json={"delay_ms": 2500})
    assert moved.status_code == 200, moved.text
    new_run_at = datetime.fromisoformat(moved.json()["run_at"]).timestamp()
    assert moved.json()["state"] == "scheduled"
    assert await collector.wait_for([str(job["id"])], 15) == set()
    await collector.settle(0.5)
    [delivery] = collector.deliveries[str(job["id"])]
    assert delivery.received_at >= new_run_at
    assert orjson.loads(delivery.body) == 1


async def test_a_job_moved_earlier_fires_at_the_new_time(node: Node, collector: Collector) -> None:
    soon = await submit(node, payload="soon", delay_ms=40_000)  # loaded, due in 40 s
    later = await submit(node, payload="later", delay_ms=3_600_000)  # beyond the window
    async with client(node) as http:
        for job in (soon, later):
            moved = await http.patch(
                f"/v1/jobs/{job['id']}",
                json={"delay_ms": 300, "payload": {"moved": True}, "priority": 7},
            )
            assert moved.status_code == 200, moved.text
            assert moved.json()["priority"] == 7
    assert await collector.wait_for([str(soon["id"]), str(later["id"])], 20) == set()
    for job in (soon, later):
        [delivery] = collector.deliveries[str(job["id"])]
        assert orjson.loads(delivery.body) == {"moved": True}
        assert delivery.properties["priority"] == 7


async def test_a_job_moved_by_another_node_fires_at_its_new_time_here(
    node: Node, collector: Collector, database_url: str
) -> None:
    job = await submit(node, payload=1, delay_ms=3_600_000)
    other_db = Database(database_url, min_size=1, max_size=1, timeout_s=5)
    await other_db.open()
    try:  # what the node serving the PATCH does; the owner only hears of it
        other = JobStore(other_db, node_id="other", lease_s=30)
        run_at = datetime.now(UTC) + timedelta(milliseconds=300)
        await other.reschedule(uuid.UUID(str(job["id"])), models.JobChange(run_at=run_at))
    finally:
        await other_db.close()
    assert await collector.wait_for([str(job["id"])], 20) == set()


async def test_due_notices_resume_after_their_connection_is_cut(
    node: Node, collector: Collector, database_url: str
) -> None:
    job = await submit(node, payload=1, delay_ms=3_600_000)
    connection = await asyncpg.connect(database_url)
    try:
        listener = f"dispatcher-{node.settings.node_id}-notices"  # its application_name
        cut = await connection.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1",
            listener,
        )
        assert cut == 1
        async with asyncio.timeout(15):
            while not await connection.fetchval(  # noqa: ASYNC110 - another session's state
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = $1 AND query LIKE 'LISTEN%'",
                listener,
            ):
                await asyncio.sleep(0.1)
    finally:
        await connection.close()
    async with client(node) as http:
        moved = await http.patch(f"/v1/jobs/{job['id']}", json={"delay_ms": 200})
    assert moved.status_code == 200
    assert await collector.wait_for([str(job["id"])], 20) == set()


async def test_bad_changes_are_refused_by_name_and_change_nothing(node: Node) -> None:
    job = await submit(node, payload={"keep": 1}, delay_ms=600_000, priority=3)
    async with client(node) as http:
        cases: list[tuple[object, int, str]] = [
            ({}, 422, "body"),
            ({"delay_ms": 10, "run_at": at(time.time() + 5)}, 422, "run_at"),
            ({"delay_ms": -1}, 422, "delay_ms"),
            ({"priority": 10}, 422, "priority"),
            ({"run_at": "tomorrow"}, 422, "run_at"),
            ({"run_at": None}, 422, "run_at"),
            ({"delay_ms": 10**15}, 422, "delay_ms"),
            ({"routing_key": "moved.b"}, 422, "routing_key"),
            ({"payload": "x" * (300 * 1024)}, 413, "payload"),
        ]
        for body, status, field in cases:
            response = await http.patch(f"/v1/jobs/{job['id']}", json=body)
            assert response.status_code == status, (body, response.text)
            assert field in response.text, (body, response.text)
        after = (await http.get(f"/v1/jobs/{job['id']}")).json()
        missing = await http.patch(f"/v1/jobs/{uuid.uuid4()}", json={"delay_ms": 1})
    assert missing.status_code == 404
    assert (after["run_at"], after["payload"], after["priority"], after["updated_at"]) == (
        job["run_at"],
        {"keep": 1},
        3,
        job["updated_at"],
    )


async def test_a_fired_or_cancelled_job_cannot_be_moved(node: Node, collector: Collector) -> None:
    fired = await submit(node, payload=1)
    cancelled = await submit(node, payload=2, delay_ms=600_000)
    assert await collector.wait_for([str(fired["id"])], 15) == set()
    async with client(node) as http:
        await http.delete(f"/v1/jobs/{cancelled['id']}")
        for job, state in ((cancelled, "cancelled"), (fired, None)):
            response = await http.patch(f"/v1/jobs/{job['id']}", json={"delay_ms": 1000})
            assert response.status_code == 409
            assert response.json()["state"] == (state or response.json()["state"])
            assert response.json()["state"] in ("dispatching", "dispatched", "cancelled")


async def test_reschedule_and_cancel_racing_with_firing_have_one_answer_each(
    node: Node, collector: Collector
) -> None:
    """Jobs all due at one instant; while they fire, each is moved 3 s later or cancelled. A 200
    means it never fires at the old time (moved: fired once at the new time; cancelled: never);
    a 409 means it was already being dispatched, and it is delivered."""
    count = 600
    due = time.time() + 2.0
    async with client(node) as http:
        response = await http.post(
            "/v1/jobs/batch",
            json={
                "jobs": [
                    {"routing_key": "moved.race", "payload": i, "run_at": at(due)}
                    for i in range(count)
                ]
            },
        )
        ids = [str(job["id"]) for job in response.json()["jobs"]]
        rng = random.Random(5)
        actions = {job_id: rng.choice(("move", "cancel")) for job_id in ids}
        order = list(ids)
        rng.shuffle(order)
        answers: dict[str, tuple[int, str | None, float | None]] = {}
        in_flight = asyncio.Semaphore(16)

        async def act(job_id: str, start_s: float) -> None:
            await asyncio.sleep(max(0.0, start_s - time.time()))
            async with in_flight:
                await request(job_id)

        async def request(job_id: str) -> None:
            if actions[job_id] == "move":
                response = await http.patch(f"/v1/jobs/{job_id}", json={"delay_ms": 3000})
            else:
                response = await http.delete(f"/v1/jobs/{job_id}")
            body = response.json()
            new_run_at = None
            if response.status_code == 200 and actions[job_id] == "move":
                new_run_at = datetime.fromisoformat(body["run_at"]).timestamp()
            answers[job_id] = (response.status_code, body.get("state"), new_run_at)

        # Spread over the time the batch takes to fire, so some requests find their job fired.
        await asyncio.gather(
            *(act(job_id, due - 0.4 + 1.2 * n / count) for n, job_id in enumerate(order))
        )
    await collector.wait_for(
        [
            job_id
            for job_id, (status, _, _) in answers.items()
            if status != 200 or actions[job_id] == "move"
        ],
        30,
    )
    await collector.settle(1.0)
    tally = {"moved": 0, "cancelled": 0, "already dispatched": 0}
    for job_id, (status, state, new_run_at) in answers.items():
        arrivals = [d.received_at for d in collector.deliveries.get(job_id, [])]
        if status == 409:
            assert state in ("dispatching", "dispatched"), (job_id, state)
            assert arrivals, f"{job_id}: 409 {state} but never delivered"
            tally["already dispatched"] += 1
        elif actions[job_id] == "move":
            assert status == 200
            assert new_run_at is not None
            assert arrivals, f"{job_id} was moved and never delivered"
            assert min(arrivals) >= new_run_at, f"{job_id} fired at its old time"
            tally["moved"] += 1
        else:
            assert status == 200
            assert arrivals == [], f"{job_id} was cancelled (200) and still delivered"
            tally["cancelled"] += 1
    print(f"race over {count} jobs: {tally}")
    assert sum(tally.values()) == count


async def test_forged_due_notices_from_any_database_role_reach_no_heap(
    node: Node, collector: Collector, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Any role on the database may NOTIFY the due channel: times no clock carries, shards the
    cluster has not and routing keys that are none are refused; the node fires on."""
    job_id = uuid.uuid4()
    forged = [
        f"{job_id},1,-inf",
        f"{job_id},1,nan",
        f"{job_id},1,1e308",
        f"{job_id},99,17.5",
        f"{job_id},1,17.5,a.#",
    ]
    connection = await asyncpg.connect(database_url)
    try:
        for payload in forged:
            await connection.execute("SELECT pg_notify('dispatcher_due', $1)", payload)
    finally:
        await connection.close()
    real = await submit(node, payload="after", delay_ms=300)
    assert await collector.wait_for([str(real["id"])], 20) == set()
    refused = [r for r in caplog.records if r.getMessage().startswith("ignoring a due notice")]
    assert len(refused) == len(forged), [r.getMessage() for r in refused]
    assert not node.core.supervisor.degraded()
