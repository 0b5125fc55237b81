"""Migration 0026 moves every job into the rebuilt table: a million of them, applied by a node's
migration as an upgrade does it while a producer keeps enqueueing and replacing jobs through the
SDK's function. Every row arrives with every column; the jobs written during the move are there as
last written; the indexes, constraints, triggers and the dependencies' key are the new table's;
the producer waits only for the move's last part."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid

import asyncpg

from consumers_sdk.enqueue import enqueue
from devstack import million
from dispatcher.store import migrate
from tests.support import migrated

BEFORE = [m for m in migrate.migration_files() if m.version < "0026"]
MOVED = million.ROWS
LAST_MOVED = uuid.UUID(int=MOVED)  # million.LOAD's row i has id i
KEYS = 20  # the producer replaces the jobs of these keys over and over

# Every column of the rows million.LOAD made, as text, in id order.
DIGEST = """
SELECT count(*), md5(string_agg(
    concat_ws('|', id, shard, routing_key, namespace, priority, ttl_ms, key_release,
              has_dependents, created_at, run_at, headers, payload, state, updated_at,
              dispatched_at, last_error, lease_until, claim_epoch, claimed_by, publish_attempts,
              dispatch_round, reported, reported_error, waiting_for, ignored_kept,
              ignored_dropped, idempotency_key, released_key),
    ',' ORDER BY id))
FROM jobs WHERE id <= $1
"""
# Some of the waiting jobs wait for others: the dependencies' key to jobs must hold after.
# $1 the prerequisite.
DEPEND = """
INSERT INTO job_dependencies (job_id, prerequisite_id, position)
SELECT id, $1, 0 FROM jobs WHERE state = 'waiting' AND id <> $1 LIMIT 1000
"""


async def migrate_to_0025(dsn: str) -> None:
    await migrated.migrate_before(
        dsn, "0026", table="jobs", fill=lambda connection: connection.execute(million.LOAD, MOVED)
    )
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(DEPEND, LAST_MOVED)
        await connection.execute("UPDATE jobs SET has_dependents = true WHERE state = 'waiting'")
        await connection.execute("VACUUM ANALYZE jobs")
    finally:
        await connection.close()


async def test_a_million_jobs_move_into_the_rebuilt_table_while_a_producer_writes(
    empty_database_url: str,
) -> None:
    await migrate_to_0025(empty_database_url)
    connection = await asyncpg.connect(empty_database_url)
    producer = await asyncpg.connect(empty_database_url)
    try:
        before = await connection.fetchrow(DIGEST, LAST_MOVED)
        dependencies = await connection.fetchval("SELECT count(*) FROM job_dependencies")
        enqueued: list[str] = []
        replaced: dict[str, int] = {}  # each key's last acknowledged payload
        answered_at: list[float] = []
        migrating = True

        async def produce() -> None:
            for n in itertools.count():
                if not migrating:
                    return
                if n % 2:
                    job = await enqueue(producer, "orders.expire", {"n": n}, delay=60)
                    enqueued.append(job.id)
                else:
                    key = f"key-{n % KEYS}"
                    await enqueue(
                        producer,
                        "orders.remind",
                        {"n": n},
                        delay=60,
                        idempotency_key=key,
                        on_existing="replace",
                    )
                    replaced[key] = n
                answered_at.append(time.monotonic())
                await asyncio.sleep(0.005)

        producing = asyncio.create_task(produce())
        await asyncio.sleep(0.3)
        started = time.monotonic()
        applied = await migrate.apply_migrations(empty_database_url)
        took_s = time.monotonic() - started
        migrating = False
        await producing
        assert applied == [m.version for m in migrate.migration_files()][len(BEFORE) :]

        after = await connection.fetchrow(DIGEST, LAST_MOVED)
        assert after is not None
        assert before is not None
        assert tuple(after) == tuple(before)
        assert after[0] == MOVED
        stored = await connection.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[])", enqueued
        )
        assert stored == len(enqueued) > 0, f"{len(enqueued)} enqueued, {stored} stored"
        payloads = dict(
            await connection.fetch(
                "SELECT idempotency_key, convert_from(payload, 'UTF8')::jsonb ->> 'n' FROM jobs"
                " WHERE idempotency_key LIKE 'key-%'"
            )
        )
        assert payloads == {key: str(n) for key, n in replaced.items()}
        # The new table's: fillfactor, the generated rest, the dependencies' key.
        options = await connection.fetchval(
            "SELECT reloptions FROM pg_class WHERE relname = 'jobs'"
        )
        assert "fillfactor=50" in options
        rests = dict(
            await connection.fetch(
                "SELECT state, count(*) FILTER (WHERE rest IS NOT DISTINCT FROM"
                " CASE WHEN state IN ('waiting', 'dead', 'cancelled', 'expired') THEN state END)"
                " = count(*) FROM jobs GROUP BY state"
            )
        )
        assert set(rests.values()) == {True}
        assert await connection.fetchval("SELECT count(*) FROM job_dependencies") == dependencies
        orphan = await connection.fetchval(
            "SELECT id FROM jobs j WHERE NOT EXISTS"
            " (SELECT FROM job_dependencies d WHERE d.job_id = j.id) LIMIT 1"
        )
        await connection.execute(
            "INSERT INTO job_dependencies (job_id, prerequisite_id, position) VALUES ($1, $2, 0)",
            orphan,
            LAST_MOVED,
        )
        await connection.execute("DELETE FROM jobs WHERE id = $1", orphan)
        assert not await connection.fetchval(
            "SELECT count(*) FROM job_dependencies WHERE job_id = $1", orphan
        ), "the dependencies' key cascades from the new table"
        # The producer waited only for the move's last part (the rows written during the copy).
        held_s = max(b - a for a, b in itertools.pairwise([started, *answered_at]))
        print(
            f"0026 moved {MOVED} jobs in {took_s:.1f} s; {len(answered_at)} jobs enqueued or"
            f" replaced meanwhile, the longest wait for one {held_s:.2f} s"
        )
        assert held_s < took_s / 2
    finally:
        await producer.close()
        await connection.close()
