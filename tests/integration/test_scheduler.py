"""The scheduler of an in-process node against real PostgreSQL and RabbitMQ: memory stays within
the heap cap, and an overdue backlog drains oldest first without holding up jobs due now."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from dispatcher import models
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore
from tests.support.collector import Collector
from tests.support.nodes import client, running_node

IDS = models.JobIds()


async def insert_overdue(database_url: str, count: int, shard_count: int) -> dict[str, float]:
    """Jobs that fell due while no dispatcher ran, oldest first; returns id -> run_at."""
    db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await db.open()
    try:
        store = JobStore(db, node_id="writer", lease_s=30)
        start = datetime.now(UTC) - timedelta(minutes=10)
        jobs = [
            models.NewJob(
                id=IDS.next(),
                shard=i % shard_count,
                routing_key="sched.backlog",
                payload=b"1",
                run_at=start + timedelta(milliseconds=50 * i),
                headers={},
            )
            for i in range(count)
        ]
        for first in range(0, count, 1000):
            await store.insert(jobs[first : first + 1000])
    finally:
        await db.close()
    return {str(job.id): job.run_at.timestamp() for job in jobs}


async def test_heap_stays_within_its_cap_and_every_job_fires(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    cap = 200
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=8,
        heap_cap=cap,
        load_batch=50,
        fire_batch=50,
    ) as node:
        largest = 0

        async def watch() -> None:
            nonlocal largest
            while True:
                largest = max(largest, len(node.heap) + len(node.backlog))
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
