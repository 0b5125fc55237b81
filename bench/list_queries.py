"""GET /v1/jobs list queries and the job counts at a million jobs (devstack/million.py's table:
the newest jobs scheduled or in flight, 500 routing keys, ten tenants).

    .venv/bin/python -m bench.list_queries [--rows 1000000] [--calls 50] [--runs 3]

1. Upgrade: the jobs are stored under migrations 0001-0008, then 0009 is applied: how long job
   inserts wait for its index builds.
2. Each filter of GET /v1/jobs, with the service's statements run as the service runs them
   (asyncpg's prepared statements, so the plan cache may switch to a generic plan after five
   calls): median and p99 of ``calls`` calls, round trip included; and the list statement before
   0009 on the same table, for comparison.
3. Counting: each state's count (median of ``runs``), the whole-table GROUP BY every node ran each
   round before, and the round of a node that does not count (another holds the lock).
4. What the 0009 indexes still here (jobs_namespace; 0027 dropped jobs_state) cost writes:
   batches of 1000 inserted, then moved through three states, with and without them (alternated;
   median of ``runs``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from bench import harness
from bench.harness import median, percentile, services, write
from consumers_sdk import ids as job_ids
from devstack import million
from dispatcher import metrics, models
from dispatcher.store import migrate
from dispatcher.store.db import Database
from dispatcher.store.history import HistoryStore
from dispatcher.store.queries import history as history_sql
from dispatcher.store.queries import intake as intake_sql
from dispatcher.store.queries import job_reads as job_reads_sql
from dispatcher.store.queries import migrate as migrate_sql
from dispatcher.upkeep.housekeeping import Housekeeper

# The statements before 0009, for comparison.
PREVIOUS_LIST_JOBS = """
SELECT * FROM jobs
WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR routing_key = $2) AND id > $3
  AND ($5::text IS NULL OR coalesce(namespace, '') = $5)
ORDER BY id
LIMIT $4
"""
PREVIOUS_COUNT = "SELECT state, routing_key, count(*) AS jobs FROM jobs GROUP BY state, routing_key"
# A job's moves, standing in for claim, confirm and consumer event. $1 ids, $2 state.
MOVE = "UPDATE jobs SET state = $2, updated_at = now() WHERE id = ANY($1::uuid[])"
NEW_INDEXES = """
SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN ('jobs_namespace')
"""


async def upgrade(dsn: str, rows: int) -> float:
    """Store ``rows`` jobs under the migrations before 0009; returns how long 0009 took."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(migrate_sql.CREATE_MIGRATIONS_TABLE)
        for migration in migrate.migration_files():
            if migration.version < "0009":
                await connection.execute(migration.sql)
                await connection.execute(
                    migrate_sql.RECORD_MIGRATION, migration.version, migration.checksum
                )
        await million.load(connection, rows)
    finally:
        await connection.close()
    started = time.perf_counter()
    await migrate.apply_migrations(dsn)
    took = time.perf_counter() - started
    connection = await asyncpg.connect(dsn)
    await connection.execute("VACUUM ANALYZE jobs")
    await connection.close()
    return took


async def timed_calls(
    connection: asyncpg.Connection, query: str, args: tuple[Any, ...], calls: int
) -> list[float]:
    for _ in range(6):  # past the five custom plans the plan cache starts with
        await connection.fetch(query, *args)
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await connection.fetch(query, *args)
        times.append((time.perf_counter() - started) * 1000)
    return times


async def lists(dsn: str, calls: int) -> dict[str, dict[str, float]]:
    connection = await asyncpg.connect(dsn)
    results: dict[str, dict[str, float]] = {}
    try:
        for name, _, query, args in million.LIST_CASES:
            now = await timed_calls(connection, query, args, calls)
            figures = {"p50_ms": median(now), "p99_ms": percentile(now, 0.99)}
            if query == job_reads_sql.LIST_JOBS and args[7] is None:
                # The statement before 0009 had no routing-key filter (the last argument), nor
                # a prefix: a prefix's case has nothing to compare with.
                before = await timed_calls(connection, PREVIOUS_LIST_JOBS, args[:5], calls)
                figures["before_p50_ms"] = median(before)
            results[name] = figures
            before_ms = figures.get("before_p50_ms")
            previous = f"  (before 0009: {before_ms:7.2f} ms)" if before_ms is not None else ""
            print(
                f"  {name:32s} p50 {figures['p50_ms']:6.2f} ms  p99 {figures['p99_ms']:6.2f} ms"
                f"{previous}",
                flush=True,
            )
    finally:
        await connection.close()
    return results


async def counts(dsn: str, runs: int) -> dict[str, float]:
    connection = await asyncpg.connect(dsn)
    results: dict[str, float] = {}
    try:
        for state in models.JobState:
            each = []
            for _ in range(runs):
                started = time.perf_counter()
                if state.value in history_sql.INDEXED_STATES:
                    await connection.fetch(history_sql.COUNT_STATE, state.value, 50)
                else:
                    await connection.fetch(history_sql.COUNT_UNINDEXED_STATES, [state.value], 50)
                each.append((time.perf_counter() - started) * 1000)
            results[state.value] = median(each)
        each = []
        for _ in range(runs):
            started = time.perf_counter()
            await connection.fetch(PREVIOUS_COUNT)
            each.append((time.perf_counter() - started) * 1000)
        results["previous_group_by"] = median(each)
        results["reader_round"] = await reader_round(dsn, connection)
    finally:
        await connection.close()
    return results


async def reader_round(dsn: str, locker: asyncpg.Connection) -> float:
    """A housekeeping round of a node while another holds the count lock (median of 20, ms)."""
    db = Database(dsn, min_size=1, max_size=2, timeout_s=10)
    await db.open()
    housekeeper = Housekeeper(
        HistoryStore(db), metrics.Metrics(), retention_s=86400, batch=1, stats_interval_s=15
    )
    try:
        await housekeeper.refresh()  # the counts every node then reads
        each = []
        async with locker.transaction():
            await locker.fetchval(history_sql.TRY_COUNT_LOCK)
            for _ in range(20):
                started = time.perf_counter()
                await housekeeper.refresh()
                each.append((time.perf_counter() - started) * 1000)
    finally:
        await db.close()
    return median(each)


async def write_rate(connection: asyncpg.Connection, batches: int = 40) -> tuple[float, float]:
    """Rows per second inserted (ENQUEUE_JOBS, batches of 1000) and moved (three updates each)."""
    size = 1000
    run_at = datetime.now(UTC) + timedelta(hours=1)
    new_ids = job_ids.JobIds()
    stored: list[list[uuid.UUID]] = []
    started = time.perf_counter()
    for _ in range(batches):
        ids = [new_ids.next() for _ in range(size)]
        stored.append(ids)
        none = [None] * size
        await connection.fetch(
            intake_sql.ENQUEUE_JOBS,
            ids,
            [i % 256 for i in range(size)],
            [f"rk.{i % 50}" for i in range(size)],
            [b"{}"] * size,
            ["{}"] * size,
            none,
            none,
            none,
            [run_at] * size,
            none,
            none,
            none,
            "bench",
        )
    inserted = batches * size / (time.perf_counter() - started)
    started = time.perf_counter()
    for state in ("dispatching", "dispatched", "succeeded"):
        for ids in stored:
            for first in range(0, size, 500):
                await connection.execute(MOVE, ids[first : first + 500], state)
    moved = 3 * batches * size / (time.perf_counter() - started)
    every = [job_id for ids in stored for job_id in ids]
    await connection.execute("DELETE FROM jobs WHERE id = ANY($1::uuid[])", every)
    await connection.execute("VACUUM jobs")
    return inserted, moved


async def write_cost(dsn: str, runs: int) -> dict[str, float]:
    connection = await asyncpg.connect(dsn)
    rates: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
    try:
        definitions = [row["indexdef"] for row in await connection.fetch(NEW_INDEXES)]
        for _ in range(runs):
            rates["with"].append(await write_rate(connection))
            await connection.execute("DROP INDEX jobs_namespace")
            rates["without"].append(await write_rate(connection))
            for definition in definitions:
                await connection.execute(definition)
    finally:
        await connection.close()
    return {
        f"{kind}_{what}": median([rate[i] for rate in each])
        for kind, each in rates.items()
        for i, what in enumerate(("insert_rows_s", "moved_rows_s"))
    }


async def main(rows: int, calls: int, runs: int) -> None:
    results: dict[str, object] = {"rows": rows, "calls": calls, "runs": runs}
    with services() as svc:
        took = await upgrade(svc.database_url, rows)
        results["migration_0009_s"] = took
        print(f"  migration 0009 on {rows} jobs: {took:.1f} s", flush=True)
        results["lists"] = await lists(svc.database_url, calls)
        counted = await counts(svc.database_url, runs)
        results["counts_ms"] = counted
        states = " ".join(f"{s.value} {counted[s.value]:.1f}" for s in models.JobState)
        print(f"  count per state (ms): {states}", flush=True)
        print(
            f"  every state: {sum(counted[s.value] for s in models.JobState):.0f} ms; the whole-"
            f"table GROUP BY before: {counted['previous_group_by']:.0f} ms; a round of a node "
            f"that does not count: {counted['reader_round']:.2f} ms",
            flush=True,
        )
        cost = await write_cost(svc.database_url, runs)
        results["writes"] = cost
        print(
            f"  writes with / without the 0009 indexes: insert {cost['with_insert_rows_s']:.0f}"
            f" / {cost['without_insert_rows_s']:.0f} rows/s, three moves"
            f" {cost['with_moved_rows_s']:.0f} / {cost['without_moved_rows_s']:.0f} rows/s",
            flush=True,
        )
    print(f"  written to {write('list_queries', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=million.ROWS)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("GET /v1/jobs list queries and job counts at a million jobs")
    harness.run(main(args.rows, args.calls, args.runs))
