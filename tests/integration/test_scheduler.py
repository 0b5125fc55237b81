"""The scheduler of an in-process node against real PostgreSQL and RabbitMQ: memory stays within
the heap cap, an overdue backlog drains oldest first (at its maximum rate when one is set) without
holding up jobs due now, and a burst on one routing key does not hold up the others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from datetime import UTC, datetime

import pytest

from devstack.collector import Collector
from tests.support.nodes import client, running_node
from tests.support.overdue import insert_overdue


@pytest.mark.parametrize("publish_path", ["framed", "per_message"])
async def test_heap_stays_within_its_cap_and_every_job_fires(
    database_url: str, amqp_url: str, collector: Collector, publish_path: str
) -> None:
    cap = 200
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=8,
        heap_cap=cap,
        load_batch=50,
        fire_batch=50,
        publish_path=publish_path,
    ) as node:
        assert node.messaging.publisher.path == publish_path
        largest = 0

        async def watch() -> None:
            nonlocal largest
            while True:
                largest = max(
                    largest, node.firing.lanes.live_count + node.firing.lanes.backlog_count
                )
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        start = time.time() + 1.5
        jobs = [
            {
                "routing_key": "sched.capped",
                "payload": i,
                "run_at": datetime.fromtimestamp(start + i * 0.002, UTC).isoformat(),
            }
            for i in range(2000)
        ]
        async with client(node) as http:
            ids = []
            for first in range(0, 2000, 500):
                response = await http.post(
                    "/v1/jobs/batch", json={"jobs": jobs[first : first + 500]}
                )
                ids += [job["id"] for job in response.json()["jobs"]]
        missing = await collector.wait_for(ids, 60)
        watcher.cancel()
    assert missing == set()
    backlog_cap = max(50, cap // 4)
    assert largest <= cap * 1.1 + backlog_cap, largest


async def test_overdue_backlog_fires_oldest_first_without_starving_new_jobs(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    overdue = await insert_overdue(database_url, 4000, shard_count=8)
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=8,
        fire_batch=100,
        fire_workers=1,
    ) as node:
        async with client(node) as http:
            fresh = (
                await http.post(
                    "/v1/jobs", json={"routing_key": "sched.fresh", "payload": 0, "delay_ms": 300}
                )
            ).json()
        missing = await collector.wait_for([*overdue, fresh["id"]], 90)
    assert missing == set()
    arrival = sorted(overdue, key=lambda job_id: collector.deliveries[job_id][0].received_at)
    # Oldest first: the first tenth to arrive all come from the oldest fifth.
    oldest_fifth = set(sorted(overdue, key=overdue.__getitem__)[: len(overdue) // 5])
    assert set(arrival[: len(arrival) // 10]) <= oldest_fifth
    # Not starved: the job due now arrived while the backlog was still draining.
    fresh_at = collector.deliveries[fresh["id"]][0].received_at
    last_overdue_at = collector.deliveries[arrival[-1]][0].received_at
    assert fresh_at < last_overdue_at


def arrivals(collector: Collector, ids: Iterable[str]) -> list[float]:
    return sorted(collector.deliveries[job_id][0].received_at for job_id in ids)


# Serial: it bounds the drain rate by the clock, which a loaded machine skews.
@pytest.mark.serial
async def test_catch_up_drains_at_its_maximum_rate_while_new_jobs_fire(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    rate, batch = 1000, 100
    overdue = await insert_overdue(database_url, 3000, shard_count=8)
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=8,
        fire_batch=batch,
        catchup_max_rate=rate,
    ) as node:
        async with client(node) as http:
            fresh = [
                (
                    await http.post(
                        "/v1/jobs",
                        json={"routing_key": "sched.fresh", "payload": n, "delay_ms": delay},
                    )
                ).json()["id"]
                for n, delay in enumerate((300, 800, 1500))
            ]
        missing = await collector.wait_for([*overdue, *fresh], 90)
    assert missing == set()
    drained = arrivals(collector, overdue)
    # The bucket holds one batch; after it, no faster than the rate (slower is allowed). The
    # span starts at the first job after the bucket: the first publish of a fresh channel can
    # arrive late and shorten a span measured from the very first arrival.
    assert drained[-1] - drained[batch] >= (len(overdue) - 2 * batch) / rate * 0.95
    assert max(arrivals(collector, fresh)) < drained[-1]  # new jobs did not wait for the drain


async def test_a_burst_on_one_routing_key_does_not_hold_up_the_others(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    """6000 jobs of one key due at one instant, more than the heap may hold; jobs of another key
    due during the drain fire before it ends (the burst moves to the catch-up lane, keys take
    turns). The catch-up pace is low so that the drain outlasts the small jobs however fast the
    live lane fires before the burst is moved."""
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=8,
        heap_cap=1000,
        load_batch=500,
        fire_batch=100,
        live_lag_s=0.5,
        catchup_max_rate=500,
    ) as node:
        burst_at = time.time() + 3.0  # time to submit the burst first
        small_due = [burst_at + 0.3 + 0.1 * n for n in range(15)]
        async with client(node) as http:

            async def submit(key: str, times: list[float]) -> list[str]:
                jobs = [
                    {
                        "routing_key": key,
                        "payload": n,
                        "run_at": datetime.fromtimestamp(due, UTC).isoformat(),
                    }
                    for n, due in enumerate(times)
                ]
                response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
                assert response.status_code == 201, response.text
                return [job["id"] for job in response.json()["jobs"]]

            burst = []
            for _ in range(6):
                burst += await submit("sched.big", [burst_at] * 1000)
            small = dict(zip(await submit("sched.small", small_due), small_due, strict=True))
        missing = await collector.wait_for([*burst, *small], 90)
        demoted = node.firing.lanes.demoted
    assert missing == set()
    assert demoted > 0
    late_ms = sorted(
        (collector.deliveries[job_id][0].received_at - due) * 1000 for job_id, due in small.items()
    )
    print(f"small key lateness during the burst: p50 {late_ms[7]:.0f} ms, max {late_ms[-1]:.0f} ms")
    # The pace (500/s) keeps the burst draining past every small job's due time.
    burst_end = arrivals(collector, burst)[-1]
    assert burst_end > max(small_due)
    assert max(arrivals(collector, small)) < burst_end
