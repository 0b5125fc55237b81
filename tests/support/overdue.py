"""Jobs stored straight into the database, as if they fell due while no dispatcher ran."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from consumers_sdk import ids
from dispatcher import models
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore

IDS = ids.JobIds()


async def insert_overdue(
    database_url: str,
    count: int,
    shard_count: int,
    *,
    start: datetime | None = None,
    spacing_ms: float = 50,
    routing_key: str = "sched.backlog",
) -> dict[str, float]:
    """Jobs that fell due while no dispatcher ran (or, given a ``start``, fall due then), oldest
    first; returns id -> run_at."""
    db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await db.open()
    try:
        store = JobStore(db, node_id="writer", lease_s=30)
        start = start or datetime.now(UTC) - timedelta(minutes=10)
        jobs = [
            models.NewJob(
                id=IDS.next(),
                shard=i % shard_count,
                spec=models.JobSpec(
                    routing_key=routing_key,
                    payload=b"1",
                    run_at=start + timedelta(milliseconds=spacing_ms * i),
                    headers={},
                ),
            )
            for i in range(count)
        ]
        for first in range(0, count, 1000):
            await store.insert(jobs[first : first + 1000])
    finally:
        await db.close()
    return {str(job.id): job.spec.run_at.timestamp() for job in jobs}
