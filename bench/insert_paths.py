"""What each way of storing new jobs costs PostgreSQL, statement against statement on one
connection (no HTTP, no node): batches of 1000 through the contract functions v1 (0012, the
dispatcher's batch insert before 0024), v2 (0019, the key levers) and v3 (0024, every batch
now), and one job through INSERT_JOB (the single-job path) against v3 with one element. Each
figure is the median of the runs; the paths take turns within a run, so drift hits them alike.

    .venv/bin/python -m bench.insert_paths [--runs 5] [--batches 20] [--singles 2000]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import asyncpg

from bench import harness
from bench.harness import median, services, write
from consumers_sdk.ids import JobIds
from dispatcher.store.migrate import apply_migrations
from dispatcher.store.queries import intake as intake_sql

SIZE = 1000
V1 = """
SELECT id, created_at FROM dispatcher_enqueue_v1($1::uuid[], $2::int[], NULL, $3::text[],
    $4::bytea[], $5::jsonb[], $6::smallint[], $7::bigint[], $8::text[], $9::timestamptz[],
    $10::text[], false)
"""
V2 = """
SELECT ordinal, id, created_at, outcome FROM dispatcher_enqueue_v2($1::uuid[], $2::int[], NULL,
    $3::text[], $4::bytea[], $5::jsonb[], $6::smallint[], $7::bigint[], $8::text[],
    $9::timestamptz[], $10::text[], $11::text[], $12::text[], false, $13::text)
"""
PATHS = ("v1", "v2", "v3")
# Whether the batch's jobs carry idempotency keys (each new), or are resubmitted ones (kept).
KINDS = ("no keys", "new keys", "kept keys")


def arrays(ids: Sequence[uuid.UUID], keys: Sequence[str | None]) -> list[list[object]]:
    size = len(ids)
    run_at = datetime.now(UTC) + timedelta(days=1)
    none: list[object] = [None] * size
    return [
        list(ids),
        [i % 256 for i in range(size)],
        [f"bench.insert.{i % 50}" for i in range(size)],
        [b'{"n":1}'] * size,
        ["{}"] * size,
        none,
        none,
        list(keys),
        [run_at] * size,
        none,
    ]


async def batch(connection: asyncpg.Connection, path: str, values: list[list[object]]) -> None:
    size = len(values[0])
    if path == "v1":
        await connection.fetch(V1, *values)
        return
    statement = V2 if path == "v2" else intake_sql.ENQUEUE_JOBS
    await connection.fetch(statement, *values, [None] * size, ["keep"] * size, "bench")


async def wal_lsn(connection: asyncpg.Connection) -> int:
    return int(await connection.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def batches(connection: asyncpg.Connection, count: int) -> dict[str, dict[str, float]]:
    """Jobs/s and WAL bytes per job of each path, for each kind of batch."""
    ids = JobIds()
    figures: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        for path in PATHS:
            took = 0.0
            wal = 0
            for _ in range(count):
                new = [ids.next() for _ in range(SIZE)]
                keys: list[str | None] = (
                    [None] * SIZE if kind == "no keys" else [f"k-{job_id}" for job_id in new]
                )
                if kind == "kept keys":  # stored first, then submitted again under new ids
                    await batch(connection, "v1", arrays(new, keys))
                    new = [ids.next() for _ in range(SIZE)]
                values = arrays(new, keys)
                before = await wal_lsn(connection)
                started = time.perf_counter()
                await batch(connection, path, values)
                took += time.perf_counter() - started
                wal += await wal_lsn(connection) - before
            figures[f"{kind}, {path}"] = {
                "jobs_s": count * SIZE / took,
                "wal_bytes_per_job": wal / (count * SIZE),
            }
    await connection.execute("DELETE FROM jobs WHERE routing_key LIKE 'bench.insert.%'")
    await connection.execute("VACUUM jobs")
    return figures


async def singles(connection: asyncpg.Connection, count: int) -> dict[str, float]:
    """Median milliseconds of one keyless job's statement: INSERT_JOB, and v3 with one element
    (each its own transaction, as a sequential producer's requests are)."""
    ids = JobIds()
    each: dict[str, list[float]] = {"insert_job": [], "v3": []}
    run_at = datetime.now(UTC) + timedelta(days=1)
    for turn in range(2 * count):
        path = "insert_job" if turn % 2 == 0 else "v3"
        values = [arrays([ids.next()], [None])[column][0] for column in range(10)]
        values[8] = run_at
        started = time.perf_counter()
        if path == "insert_job":
            await connection.fetchval(intake_sql.INSERT_JOB, *values)
        else:
            await batch(connection, "v3", [[value] for value in values])
        each[path].append((time.perf_counter() - started) * 1000)
    await connection.execute("DELETE FROM jobs WHERE routing_key LIKE 'bench.insert.%'")
    return {f"{path}_ms": median(took) for path, took in each.items()}


async def main(runs: int, count: int, single: int) -> None:
    results: dict[str, object] = {"runs": runs, "batches": count, "singles": single}
    with services() as svc:
        await apply_migrations(svc.database_url)
        connection = await asyncpg.connect(svc.database_url)
        try:
            each = [await batches(connection, count) for _ in range(runs)]
            alone = [await singles(connection, single) for _ in range(runs)]
        finally:
            await connection.close()
    table = {name: harness.medians([run[name] for run in each]) for name in each[0]}
    results["batches"] = table
    print(f"  batches of {SIZE}:            jobs/s   WAL bytes/job   vs v1")
    for kind in KINDS:
        base = table[f"{kind}, v1"]["jobs_s"]
        for path in PATHS:
            row = table[f"{kind}, {path}"]
            print(
                f"    {kind:10} {path}   {row['jobs_s']:10.0f}   {row['wal_bytes_per_job']:13.0f}"
                f"   {row['jobs_s'] / base:5.2f}x"
            )
    one = harness.medians(alone)
    results["single_job_ms"] = one
    print(
        f"  one keyless job: INSERT_JOB {one['insert_job_ms']:.3f} ms, v3 {one['v3_ms']:.3f} ms"
        f" ({one['v3_ms'] / one['insert_job_ms']:.2f}x)"
    )
    print(f"  written to {write('insert_paths', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--singles", type=int, default=2000)
    args = parser.parse_args()
    print("Storing new jobs: each statement's cost")
    harness.run(main(args.runs, args.batches, args.singles))
