"""Metered routing keys on a real node, PostgreSQL and RabbitMQ: a rate lets a key's overdue jobs
go at that rate; an in-flight limit never has more of its jobs in a slow SDK consumer's hands
than it allows, and a consumer that goes silent gives its slots back after the rule's timeout; a
metered job's lateness counts apart. Ledgers: 0 lost, 0 early, duplicates counted. (Three
nodes and a kill -9 under a rate: tests/faults/test_flow_rate_failover.py.)"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator

import aio_pika
import pytest

from consumers_sdk import Consumer, Job, topology
from devstack.collector import Collector
from dispatcher.node import Node
from tests.integration.test_flow_pause import sample, submit
from tests.support.consumers import running
from tests.support.nodes import client, running_node
from tests.support.waiting import eventually, until


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, node_id="meter", shard_count=8
    ) as running_one:
        yield running_one


async def test_a_rate_lets_a_keys_jobs_go_at_that_rate_and_others_at_once(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        put = await http.put("/v1/limits/rated", json={"rate_per_s": 50, "burst": 5})
        assert put.status_code == 200, put.text
        assert put.json()["burst"] == 5
        rated = await submit(http, "rated.work", 200, start_s=0.0, spread_s=0.1)
        free = await submit(http, "free.work", 200, start_s=0.0, spread_s=0.1)
        assert await collector.wait_for(free, 30) == set()
        ledger = await collector.reckon(rated, deadline_s=30)
    assert ledger.lost == []
    assert ledger.early == []
    print(ledger)
    firsts = sorted(collector.deliveries[job][0].received_at for job in rated)
    # After the first burst, 50 a second: the slope of arrivals over time. Not the first and last
    # alone: a consumer that stalls a moment (the free key's 200 arrive beside the burst) gets
    # what queued meanwhile at once, which a span between two arrivals reads as a faster rate.
    rate = statistics.linear_regression(firsts[5:], range(5, len(firsts))).slope
    print(f"\n200 jobs of a key metered at 50/s (burst 5) arrived at {rate:.1f}/s")
    # At most the rate; below it only by what a loaded machine's stalls lose: while the node
    # stands still, the bucket keeps no more than its burst, and the time is gone.
    assert 0.6 * 50 <= rate <= 55, rate
    free_last = max(collector.deliveries[job][0].received_at for job in free)
    assert free_last < firsts[100]  # the other key never waited for the metered one
    # Their lateness, the rule's doing, is counted apart from the dispatcher's own.
    assert sample(node, "dispatcher_held_lateness_seconds_count") >= 200
    assert sample(node, "dispatcher_flow_rules", limit="rate") == 1


async def test_an_in_flight_limit_holds_with_a_slow_consumer_reporting_outcomes(
    node: Node, amqp_url: str
) -> None:
    limit, jobs = 20, 200
    consumer = Consumer(amqp_url, group="slow", prefetch=100, concurrency=100)
    busy, most, handled = 0, 0, list[str]()

    @consumer.handler("slow.work")
    async def work(job: Job) -> None:
        nonlocal busy, most
        busy += 1
        most = max(most, busy)
        try:
            await asyncio.sleep(0.2)
        finally:
            busy -= 1
        handled.append(job.id)

    async with running(consumer), client(node) as http:
        put = await http.put("/v1/limits/slow", json={"max_in_flight": limit})
        assert put.status_code == 200, put.text
        assert put.json()["in_flight_timeout_s"] == 300
        accepted = await submit(http, "slow.work", jobs, start_s=0.0, spread_s=0.1)
        started = time.monotonic()
        await eventually(lambda: len(set(handled)) == jobs, 60)
        took_s = time.monotonic() - started
    print(
        f"\n{jobs} jobs of a key limited to {limit} in flight, handled 0.2 s each by a consumer"
        f" running up to 100 at once: at most {most} at once, all handled in {took_s:.1f} s"
        f" ({len(handled) - len(set(handled))} duplicates)"
    )
    assert set(handled) == set(accepted)  # none lost
    assert most <= limit
    assert most >= limit // 2  # the limit, not something else, held them back


async def test_a_silent_consumer_gives_its_slots_back_after_the_timeout(
    node: Node, collector: Collector
) -> None:
    # The collector takes each job and reports nothing: no slot is freed but by the timeout.
    limit, timeout_s = 5, 1.5
    async with client(node) as http:
        put = await http.put(
            "/v1/limits/mute",
            json={"max_in_flight": limit, "in_flight_timeout_s": timeout_s},
        )
        assert put.status_code == 200, put.text
        sent = time.time()
        accepted = await submit(http, "mute.work", 3 * limit, start_s=0.0, spread_s=0.1)
        ledger = await collector.reckon(accepted, deadline_s=30)
    assert ledger.lost == []
    assert ledger.early == []
    firsts = sorted(collector.deliveries[job][0].received_at for job in accepted)
    print(f"\narrivals after the first: {[round(at - firsts[0], 2) for at in firsts]}")
    # Five at once, then five more once their slots timed out, then the last five. A slot is
    # taken once its job exists, after ``sent``: the next five arrive a timeout after that at the
    # earliest. Not after the first arrival: the first five may reach this consumer late (a
    # loaded machine), which would leave less than a timeout before the next five.
    assert firsts[limit - 1] - firsts[0] < timeout_s * 0.6
    assert firsts[limit] - sent >= timeout_s * 0.9
    assert firsts[2 * limit] - sent >= 2 * timeout_s * 0.9


async def test_a_rule_meters_jobs_already_in_memory_and_one_stored_behind_its_look(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        # Loaded into the node's memory before any rule: the claim meters them all the same.
        loaded = await submit(http, "late.work", 60, start_s=1.5, spread_s=0.1)
        await asyncio.sleep(0.5)
        assert node.firing.lanes.live_count == 60
        put = await http.put("/v1/limits/late", json={"rate_per_s": 20, "burst": 2})
        assert put.status_code == 200, put.text
        ledger = await collector.reckon(loaded, deadline_s=30)
        firsts = sorted(collector.deliveries[job][0].received_at for job in loaded)
        rate = statistics.linear_regression(firsts[2:], range(2, len(firsts))).slope  # as above
        # Quiet since: a job stored due an hour ago, behind the meter's last look, goes at once
        # (told by intake), not at the next whole look (30 s).
        await asyncio.sleep(1.0)
        stored_at = time.time()
        behind = await submit(http, "late.work", 1, start_s=-3600.0, spread_s=0.0)
        assert await collector.wait_for(behind, 10) == set()
    assert ledger.lost == []
    assert ledger.early == []
    print(f"\n60 jobs in memory before a 20/s rule went at {rate:.1f}/s")
    assert 0.6 * 20 <= rate <= 23, rate  # as in the first test
    [job] = behind
    assert collector.deliveries[job][0].received_at - stored_at < 2.0


async def test_a_metered_job_the_broker_refused_fires_again_under_the_grant_it_had(
    node: Node, collector: Collector, amqp_url: str
) -> None:
    """A job its meter let go, refused by RabbitMQ (a nack: a queue full, set to reject-publish),
    is given back and tried again after its quarantine delay under the same grant: the meter is
    not asked again (no second token) and the retry does not wait for the meter's next ask
    (``looks.PENDING_S``, 10 s)."""
    refusing = topology.QueueSpec(
        "refuses-granted-work",
        {"x-max-length": 0, "x-overflow": "reject-publish"},
        bindings=((topology.jobs_exchange(), "granted.work"),),
    )
    await topology.declare(amqp_url, lambda _major: [refusing])
    connection = await aio_pika.connect(amqp_url)
    try:
        async with client(node) as http:
            put = await http.put("/v1/limits/granted", json={"rate_per_s": 5, "burst": 1})
            assert put.status_code == 200, put.text
            [job] = await submit(http, "granted.work", 1, start_s=0.0, spread_s=0.0)
            # The collector's queue took the refused publish: the broker nacked it for the other.
            assert await collector.wait_for([job], 10) == set()
            await (await connection.channel()).queue_delete(refusing.name)
            await eventually(lambda: len(collector.deliveries[job]) >= 2, 30)

            async def marked() -> bool:  # the confirm's mark is written after the delivery
                return (await http.get(f"/v1/jobs/{job}")).json()["state"] != "dispatching"

            await until(marked, 10)
            stored = await http.get(f"/v1/jobs/{job}")
            assert stored.json()["state"] in {"dispatched", "succeeded"}, stored.text  # not parked
    finally:
        await connection.close()
    first, again = (delivery.received_at for delivery in collector.deliveries[job][:2])
    print(f"\nrefused, then fired again {again - first:.2f}s later under its grant")
    assert again - first < 5.0
    assert sample(node, "dispatcher_flow_let_go_total") == 1
