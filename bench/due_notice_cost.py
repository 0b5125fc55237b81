"""What a due notice per job would cost a bulk requeue (why ``BULK_REQUEUE`` sends none): ``--jobs``
dead jobs requeued in transactions of ``--batch``, as the bulk runner does, with and without a
``dispatcher_notify_due_v1`` per row while one connection LISTENs (as every node does), and what
the listening node would spend parsing the notices (``due_notices.parse``).

    .venv/bin/python -m bench.due_notice_cost [--jobs 100000] [--batch 500]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from bench import harness
from bench.bulk_requeue import copy_dead
from bench.harness import services, write
from dispatcher.store import due_notices
from dispatcher.store.migrate import apply_migrations

# $1 batch size. The bulk requeue's change (run_at now, a new round) of the next dead jobs, with
# or without a notice each: the two statements differ in that alone.
REQUEUE = """
WITH picked AS (SELECT id FROM jobs WHERE state = 'dead' ORDER BY id LIMIT $1)
UPDATE jobs j SET state = 'scheduled', run_at = now(), dispatch_round = gen_random_uuid(),
                  updated_at = now()
FROM picked WHERE j.id = picked.id
RETURNING j.id
"""
NOTIFIED = """
WITH picked AS (SELECT id FROM jobs WHERE state = 'dead' ORDER BY id LIMIT $1),
changed AS (
    UPDATE jobs j SET state = 'scheduled', run_at = now(), dispatch_round = gen_random_uuid(),
                      updated_at = now()
    FROM picked WHERE j.id = picked.id
    RETURNING j.id, j.shard, j.run_at, j.routing_key
)
SELECT count(dispatcher_notify_due_v1(id, shard, run_at, routing_key)) FROM changed
"""


async def requeue_all(dsn: str, query: str, batch: int) -> tuple[float, int]:
    """Seconds to requeue every dead job, batch by batch; the notices a listener received."""
    heard: list[str] = []
    listener = await asyncpg.connect(dsn)
    await listener.add_listener(due_notices.CHANNEL, lambda *args: heard.append(args[3]))
    worker = await asyncpg.connect(dsn)
    try:
        started = time.perf_counter()
        while True:
            async with worker.transaction():
                rows = await worker.fetch(query, batch)
            if query is REQUEUE and len(rows) < batch:
                break
            if query is NOTIFIED and rows[0][0] < batch:
                break
        took = time.perf_counter() - started
        await asyncio.sleep(1)  # the last notices in flight
    finally:
        await worker.close()
        await listener.close()
    return took, len(heard)


async def main(jobs: int, batch: int) -> None:
    with services() as svc:
        await apply_migrations(svc.database_url)
        await copy_dead(svc.database_url, jobs)
        plain_s, _ = await requeue_all(svc.database_url, REQUEUE, batch)
        await copy_dead(svc.database_url, jobs)
        notified_s, heard = await requeue_all(svc.database_url, NOTIFIED, batch)
    sample = f"{'0' * 8}-0000-7000-8000-{'0' * 12},17,1764417600.123456,billing.charge"
    started = time.perf_counter()
    for _ in range(heard or jobs):
        due_notices.parse(sample, 256)
    parse_s = time.perf_counter() - started
    print(
        f"  requeue of {jobs:,} dead jobs in batches of {batch}: {plain_s:.2f} s without notices,"
        f" {notified_s:.2f} s with one a job ({notified_s / plain_s:.2f}x; {heard:,} heard by a"
        f" listener); parsing them costs a node {parse_s:.2f} s of its event loop",
        flush=True,
    )
    results = {
        "jobs": jobs,
        "batch": batch,
        "plain_s": plain_s,
        "notified_s": notified_s,
        "heard": heard,
        "parse_s": parse_s,
    }
    print(f"  written to {write('due_notice_cost', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    print("due notices: what one per requeued job would cost")
    harness.run(main(args.jobs, args.batch))
