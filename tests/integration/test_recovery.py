"""Recovery never starves, on an in-process node against real PostgreSQL and RabbitMQ: while a
paced catch-up drains a large backlog, claims whose lease ran out and claims released by another
node fire long before the backlog is through (they have a lane of their own)."""

from __future__ import annotations

import uuid

import asyncpg

from devstack.collector import Collector
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore
from tests.support.nodes import running_node
from tests.support.overdue import insert_overdue

SHARDS = 8
KEY = "recovery.work"  # one routing key for all: the backlog's turns cannot help the others


async def claim_as_ghost(database_url: str, ids: list[str], lease_s: float) -> None:
    """What a node that died (or lost the shards) leaves: the jobs claimed under its name."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "UPDATE jobs SET state = 'dispatching', claimed_by = 'ghost',"
            " lease_until = now() + make_interval(secs => $2),"
            " publish_attempts = publish_attempts + 1"
            " WHERE id = ANY($1::uuid[])",
            ids,
            lease_s,
        )
    finally:
        await connection.close()


async def test_expired_leases_and_released_claims_fire_long_before_a_paced_backlog_drains(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    # The oldest jobs of all are the ones recovered: in the backlog's order they would come first,
    # yet, claimed elsewhere when the catch-up starts, only recovery can bring them back.
    jobs = list(await insert_overdue(database_url, 3040, SHARDS, spacing_ms=10, routing_key=KEY))
    expiring, released, backlog = jobs[:20], jobs[20:40], jobs[40:]
    await claim_as_ghost(database_url, expiring, lease_s=1.0)
    await claim_as_ghost(database_url, released, lease_s=600.0)
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=SHARDS,
        catchup_max_rate=200,  # 3000 overdue jobs take 15 s
        lease_s=4,
        fire_batch=50,
    ):
        assert await collector.wait_for_count(100, 30) == 0  # the catch-up is under way
        db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
        await db.open()
        try:
            # The ghost gives its claims back after its shards moved here (a due notice each).
            await JobStore(db, node_id="ghost", lease_s=600).release(
                [uuid.UUID(job_id) for job_id in released], announce=True
            )
        finally:
            await db.close()
        missing = await collector.wait_for([*expiring, *released, *backlog], 90)
    assert missing == set()
    arrived = {
        job_id: deliveries[0].received_at for job_id, deliveries in collector.deliveries.items()
    }
    last_recovered = max(arrived[job_id] for job_id in (*expiring, *released))
    backlog_by_then = sum(1 for job_id in backlog if arrived[job_id] <= last_recovered)
    assert backlog_by_then < len(backlog) / 2, (backlog_by_then, len(backlog))
