"""A paused routing key on a real node, PostgreSQL and RabbitMQ: none of its jobs is published
while paused, another key fires on time beside it, held jobs stay out of memory, and on resume
they all arrive, oldest due first; a pause with an end lets go by itself; a rule changed through
one node is obeyed by another within a second; rules outlive a restart. Ledgers: 0 lost, 0
early, duplicates counted."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from devstack.collector import Collector
from dispatcher.node import Node
from tests.support.nodes import client, running_node
from tests.support.waiting import until

HELD, FREE = "payments.charge", "mail.send"
JOBS = 10_000  # of each key
START_S, SPREAD_S = 3.0, 4.0  # the held key's jobs fall due over 4 s, from 3 s after submitting
# The other key's over 8 s from then (1 250 a second, within what this machine fires while the
# held key's fall due beside them): at 2 500 a second the backlog alone made its lateness,
# p99 3-4 s and 9.6 s once on a slower day, and the test measured capacity, not the pause.
FREE_SPREAD_S = 8.0
FIRE_BATCH, FIRE_WORKERS = 100, 4
CATCHUP_RATE = 4000  # DISPATCHER_CATCHUP_MAX_RATE: released jobs drain at this pace


async def submit(
    http: httpx.AsyncClient,
    routing_key: str,
    count: int,
    *,
    start_s: float,
    spread_s: float,
    accepted_at: dict[str, float] | None = None,
) -> dict[str, float]:
    """COUNT jobs due from START_S seconds on, spread evenly; id -> due (POSIX seconds). Each
    job's due time or the time its batch was answered, whichever is later, goes to
    ``accepted_at``: no dispatcher fires a job before it holds it."""
    accepted: dict[str, float] = {}
    now = datetime.now(UTC)
    for first in range(0, count, 500):
        jobs = []
        for n in range(first, min(count, first + 500)):
            at = now + timedelta(seconds=start_s + spread_s * n / count)
            jobs.append({"routing_key": routing_key, "payload": n, "run_at": at.isoformat()})
        answer = await http.post("/v1/jobs/batch", json={"jobs": jobs})
        assert answer.status_code == 201, answer.text
        answered_at = time.time()
        for job, sent in zip(answer.json()["jobs"], jobs, strict=True):
            accepted[job["id"]] = datetime.fromisoformat(str(sent["run_at"])).timestamp()
            if accepted_at is not None:
                accepted_at[job["id"]] = max(accepted[job["id"]], answered_at)
    return accepted


async def states(database_url: str, routing_key: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT state, count(*) FROM jobs WHERE routing_key = $1 GROUP BY state", routing_key
        )
    finally:
        await connection.close()
    return {row["state"]: row["count"] for row in rows}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="pause",
        shard_count=8,
        fire_batch=FIRE_BATCH,
        fire_workers=FIRE_WORKERS,
        catchup_max_rate=CATCHUP_RATE,
    ) as running:
        yield running


# Serial: it holds the other key to its due times, which a loaded machine would skew.
@pytest.mark.serial
async def test_a_paused_key_publishes_nothing_until_resumed_then_all_oldest_first(
    node: Node, database_url: str, collector: Collector
) -> None:
    async with client(node) as http:
        paused = await http.post("/v1/limits/payments/pause", json={"note": "test"})
        assert paused.status_code == 200, paused.text
        held = await submit(http, HELD, JOBS, start_s=START_S, spread_s=SPREAD_S)
        free_held_from: dict[str, float] = {}
        free = await submit(
            http, FREE, JOBS, start_s=START_S, spread_s=FREE_SPREAD_S, accepted_at=free_held_from
        )
        assert await collector.wait_for(free, 60) == set()
        await collector.settle(1.0)
        # Nothing of the paused key reached the broker; every one is still scheduled, out of memory.
        assert not held.keys() & collector.deliveries.keys()
        assert await states(database_url, HELD) == {"scheduled": JOBS}
        assert node.firing.lanes.live_count + node.firing.lanes.backlog_count == 0
        # The other key fired on time beside it (from its due time, or from when it was stored
        # if the test, on a loaded machine, was slower to submit it).
        free_late = collector.lateness(free_held_from)
        assert statistics.quantiles(free_late, n=100)[98] < 5.0
        fired_before = sample(node, "dispatcher_fire_lateness_seconds_count")
        assert sample(node, "dispatcher_held_lateness_seconds_count") == 0
        assert sample(node, "dispatcher_flow_rules", limit="paused") == 1
        resumed_at = time.time()
        resumed = await http.post("/v1/limits/payments/resume")
        assert resumed.status_code == 200, resumed.text
        ledger = await collector.reckon(held, deadline_s=60)
    assert ledger.lost == []
    assert ledger.early == []
    print(ledger)  # duplicates are counted, not failed: at-least-once allows them
    # Their lateness, an operator's choice, is counted apart from the dispatcher's own.
    assert sample(node, "dispatcher_held_lateness_seconds_count") >= JOBS
    assert sample(node, "dispatcher_fire_lateness_seconds_count") == fired_before
    assert sample(node, "dispatcher_flow_rules", limit="paused") == 0
    firsts = {job: collector.deliveries[job][0].received_at for job in held}
    assert min(firsts.values()) >= resumed_at
    # Oldest due first, a firing batch at a time: the batches in flight at once (FIRE_WORKERS)
    # may land in any order, no job further from its place in due order than they hold.
    by_due = sorted(held, key=held.__getitem__)
    arrived = sorted(held, key=firsts.__getitem__)
    place = {job: n for n, job in enumerate(by_due)}
    displaced = max(abs(n - place[job]) for n, job in enumerate(arrived))
    assert displaced <= FIRE_WORKERS * FIRE_BATCH, displaced
    # At the catch-up pace: its bucket holds a batch, the rest waits for its tokens.
    drained_s = max(firsts.values()) - min(firsts.values())
    assert drained_s >= (JOBS - FIRE_BATCH) / CATCHUP_RATE * 0.9, drained_s


async def test_a_pause_with_an_end_lets_its_jobs_go_then_and_not_before(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        ends = datetime.now(UTC) + timedelta(seconds=3)
        paused = await http.post("/v1/limits/payments/pause", json={"until": ends.isoformat()})
        assert paused.status_code == 200, paused.text
        held = await submit(http, HELD, 100, start_s=0.2, spread_s=0.5)
        ledger = await collector.reckon(held, deadline_s=30)
        rules = (await http.get("/v1/limits")).json()["limits"]
    assert ledger.lost == []
    assert ledger.early == []
    assert min(got[0].received_at for got in collector.deliveries.values()) >= ends.timestamp()
    assert [rule["holding"] for rule in rules] == [False]  # kept, no longer holding


async def test_a_held_job_moved_or_cancelled_is_moved_or_cancelled(
    node: Node, database_url: str, collector: Collector
) -> None:
    async with client(node) as http:
        await http.post("/v1/limits/payments/pause", json={})
        held = await submit(http, HELD, 3, start_s=0.1, spread_s=0.1)
        first, second, third = held
        await asyncio.sleep(1.0)
        cancelled = await http.delete(f"/v1/jobs/{first}")
        assert cancelled.json()["state"] == "cancelled"
        later = datetime.now(UTC) + timedelta(hours=1)
        moved = await http.patch(f"/v1/jobs/{second}", json={"run_at": later.isoformat()})
        assert moved.status_code == 200, moved.text
        await http.post("/v1/limits/payments/resume")
        assert await collector.wait_for([third], 20) == set()
        await collector.settle(1.0)
    assert collector.deliveries.keys() == {third}
    assert await states(database_url, HELD) == {"cancelled": 1, "scheduled": 1, "dispatched": 1}


def sample(node: Node, name: str, **labels: str) -> float:
    return node.core.metrics.registry.get_sample_value(name, labels) or 0.0


def member(database_url: str, amqp_url: str, zk_hosts: str, name: str) -> Any:
    return running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        zk_hosts=zk_hosts,
        zk_session_timeout_s=4,
        node_id=name,
        shard_count=8,
    )


# Serial: it times the pause's way to the other node against the second the docs promise, which
# a loaded machine stretches (1.13 s once in the parallel pass, the nodes' ZooKeeper sessions
# lost beside it).
@pytest.mark.serial
async def test_a_pause_made_through_one_node_holds_on_the_other_within_a_second(
    database_url: str, amqp_url: str, zk_hosts: str, collector: Collector
) -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(member(database_url, amqp_url, zk_hosts, "a"))
        b = await stack.enter_async_context(member(database_url, amqp_url, zk_hosts, "b"))
        await until(lambda: _owned_by_both(a, b), 30)
        async with client(a) as http_a:
            made = time.monotonic()
            await http_a.post("/v1/limits/payments/pause", json={})
            await until(lambda: _holds(b, HELD), 5)
            assert time.monotonic() - made < 1.0
            # Both nodes' shards hold the key's jobs.
            held = await submit(http_a, HELD, 200, start_s=0.2, spread_s=0.3)
            free = await submit(http_a, FREE, 200, start_s=0.2, spread_s=0.3)
            assert await collector.wait_for(free, 30) == set()
            await collector.settle(1.0)
            assert not held.keys() & collector.deliveries.keys()
            made = time.monotonic()
            await http_a.post("/v1/limits/payments/resume")
            await until(lambda: _free(b, HELD), 5)
            assert time.monotonic() - made < 1.0
            ledger = await collector.reckon(held, deadline_s=30)
    assert ledger.lost == []
    assert ledger.early == []


async def test_a_node_started_with_a_paused_key_never_fires_it(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    settings: dict[str, Any] = {
        "database_url": database_url,
        "amqp_url": amqp_url,
        "node_id": "restart",
        "shard_count": 8,
    }
    async with running_node(**settings) as first, client(first) as http:
        await http.post("/v1/limits/payments/pause", json={})
        held = await submit(http, HELD, 50, start_s=30.0, spread_s=0.1)
    await asyncio.sleep(0.5)
    # The jobs fall due while no node runs; the next node reads the rule before it fires.
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "UPDATE jobs SET run_at = now() - interval '1 second' WHERE routing_key = $1", HELD
        )
    finally:
        await connection.close()
    async with running_node(**settings) as second, client(second) as http:
        await asyncio.sleep(2.0)
        assert not held.keys() & collector.deliveries.keys()
        await http.post("/v1/limits/payments/resume")
        assert await collector.wait_for(held, 20) == set()


async def _owned_by_both(a: Node, b: Node) -> bool:
    return bool(a.coordination.ownership.epochs()) and bool(b.coordination.ownership.epochs())


async def _holds(node: Node, routing_key: str) -> bool:
    return node.firing.flow.book.holds(routing_key, None, datetime.now(UTC)) is not None


async def _free(node: Node, routing_key: str) -> bool:
    return not await _holds(node, routing_key)
