"""Migration 0025 moves every stored event into event batches: a million of them, applied by a
node's migration as an upgrade does it while producers keep enqueueing through the SDK's
function. Every event arrives with every field, in the order received (those from before 0014,
which have no order, first by their own times), and a moved job's history reads every one of its
events; no job enqueued meanwhile is lost."""

from __future__ import annotations

import asyncio
import itertools
import time

import asyncpg

from consumers_sdk.enqueue import enqueue
from dispatcher.store import migrate
from dispatcher.store.db import Database
from dispatcher.store.history import HistoryStore
from tests.support import migrated
from tests.support.stored_events import STORED_EVENTS

EVENTS = 1_000_000
JOBS = 50_000
BEFORE = [m for m in migrate.migration_files() if m.version < "0025"]

# job_events as 0004, 0011, 0014 and 0019 left it, filled: every kind of event, with and
# without each optional field, several jobs' events interleaved as deliveries record them.
FILL = """
INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group, consumer, error, at,
                        recorded_at, round, ignored, received, detail)
SELECT gen_random_uuid(),
       jobs.ids[1 + n % $2],
       (ARRAY['started', 'succeeded', 'failed', 'dead', 'requeued', 'dispatched', 'replaced',
              'extended', 'rescheduled', 'cancelled'])[1 + n % 10],
       n % 7, 'group-' || n % 3, 'consumer-' || n % 5,
       CASE WHEN n % 4 = 0 THEN 'error ' || n END,
       '2026-01-01'::timestamptz + make_interval(secs => n % 1000),
       '2026-01-01'::timestamptz + make_interval(secs => n / 1000),
       CASE WHEN n % 3 > 0 THEN gen_random_uuid() END,
       (ARRAY[NULL, 'other_round', 'no_round', 'routing_key', 'no_user', 'publisher'])[1 + n % 6],
       CASE WHEN n > $3 THEN $1 - n END,  -- the first $3 recorded before 0014
       CASE WHEN n % 10 >= 6 THEN 'detail ' || n END
FROM generate_series(1, $1) AS n,
     (SELECT array_agg(gen_random_uuid()) AS ids FROM generate_series(1, $2)) AS jobs
"""
# One job's events, as its history shows them. $1 job id.
JOB_EVENTS = """
SELECT outcome, attempt, consumer_group, consumer, error, at, ignored, detail
FROM job_events WHERE job_id = $1
"""
# Every event's fields as text, in the order received, before and after.
DIGEST_BEFORE = """
SELECT count(*), md5(string_agg(
    concat_ws('|', event_id, job_id, outcome, attempt, consumer_group, consumer, error, at, round,
              ignored, detail),
    ',' ORDER BY received NULLS FIRST, at, event_id))
FROM job_events
"""
DIGEST_AFTER = f"""
SELECT count(*), md5(string_agg(
    concat_ws('|', event_id, job_id, outcome, attempt, consumer_group, consumer, error, at, round,
              ignored, detail),
    ',' ORDER BY batch, position))
FROM {STORED_EVENTS}
"""


async def migrate_to_0024(dsn: str) -> None:
    await migrated.migrate_before(
        dsn,
        "0025",
        table="job_events",
        fill=lambda connection: connection.execute(FILL, EVENTS, JOBS, EVENTS // 10),
    )


async def test_a_million_events_move_into_batches_in_order_while_producers_enqueue(
    empty_database_url: str,
) -> None:
    await migrate_to_0024(empty_database_url)
    connection = await asyncpg.connect(empty_database_url)
    producer = await asyncpg.connect(empty_database_url)
    try:
        before = await connection.fetchrow(DIGEST_BEFORE)
        job = await connection.fetchval("SELECT job_id FROM job_events LIMIT 1")
        job_events = await connection.fetch(JOB_EVENTS, job)
        enqueued: list[str] = []
        answered_at: list[float] = []
        migrating = True

        async def produce() -> None:
            while migrating:
                job = await enqueue(producer, "orders.expire", {"n": len(enqueued)}, delay=60)
                enqueued.append(job.id)
                answered_at.append(time.monotonic())
                await asyncio.sleep(0.005)

        producing = asyncio.create_task(produce())
        await asyncio.sleep(0.2)
        started = time.monotonic()
        applied = await migrate.apply_migrations(empty_database_url)
        took_s = time.monotonic() - started
        migrating = False
        await producing
        assert applied == [m.version for m in migrate.migration_files()][len(BEFORE) :]

        after = await connection.fetchrow(DIGEST_AFTER)
        assert after is not None
        assert before is not None
        assert tuple(after) == tuple(before)
        assert after[0] == EVENTS
        sizes = await connection.fetchval(
            "SELECT array_agg(DISTINCT cardinality(event_ids)) FROM event_batches"
        )
        assert sizes == [1000]
        assert await connection.fetchval("SELECT to_regclass('job_events')") is None
        stored = await connection.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[])", enqueued
        )
        assert stored == len(enqueued) > 0, f"{len(enqueued)} enqueued, {stored} stored"
        # The producer waited only for the migration's end (its lock on jobs), never through
        # the move of the events.
        held_s = max(b - a for a, b in itertools.pairwise([started, *answered_at]))
        print(
            f"0025 moved {EVENTS} events in {took_s:.1f} s; {len(enqueued)} jobs enqueued"
            f" meanwhile, the longest wait for one {held_s:.2f} s"
        )
        assert held_s < took_s / 2
    finally:
        await producer.close()
        await connection.close()
    # A moved job's history, read through the index on milliseconds: every one of its events.
    db = Database(empty_database_url, min_size=1, max_size=1, timeout_s=10)
    await db.open()
    try:
        history = await HistoryStore(db).history(job)
    finally:
        await db.close()
    assert len(job_events) == EVENTS // JOBS
    assert sorted(
        (e.outcome, e.attempt, e.group, e.consumer, e.error, e.at, e.ignored, e.detail)
        for e in history.events
    ) == sorted(tuple(row) for row in job_events)
