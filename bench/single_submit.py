"""One job per request, as a producer calling `POST /v1/jobs` sees it: one sequential client, and
64 concurrent clients (wrk, a native client: Python clients cap out below the server here).
Against, in the same run: one durable INSERT and commit per row over asyncpg on one connection,
in a loop (the sequential ceiling), and the dispatcher's own group commit fed by 64 concurrent
submitters in-process, without HTTP (the concurrent ceiling).

    .venv/bin/python -m bench.single_submit [--seconds 10] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from bench import harness
from bench.harness import median, one_node, percentile, services, write
from bench.throughput import far, wrk
from consumers_sdk.ids import JobIds, shard_for
from dispatcher.intake.group_commit import GroupCommit
from dispatcher.models import JobSpec, NewJob
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore
from dispatcher.store.migrate import apply_migrations

CONCURRENT = 64
SHARDS = range(256)
ROW = (
    "INSERT INTO jobs (id, shard, routing_key, payload, headers, run_at)"
    " VALUES ($1, $2, $3, $4, '{}', $5)"
)


async def insert_each(dsn: str, seconds: float) -> tuple[float, float, float]:
    """Rows/s, p50 and p99 of one INSERT committed at a time on one connection."""
    connection = await asyncpg.connect(dsn)
    ids = JobIds()
    run_at = datetime.now(UTC) + timedelta(days=1)
    took: list[float] = []
    try:
        end = time.perf_counter() + seconds
        while (started := time.perf_counter()) < end:
            await connection.execute(ROW, ids.next(), 0, "bench.ceiling", b'{"n":1}', run_at)
            took.append(time.perf_counter() - started)
        await connection.execute("DELETE FROM jobs WHERE routing_key = 'bench.ceiling'")
    finally:
        await connection.close()
    return len(took) / sum(took), percentile(took, 0.5), percentile(took, 0.99)


async def group_commit(dsn: str, seconds: float) -> tuple[float, float, float]:
    """Rows/s, p50 and p99 of 64 submitters each awaiting its own row through GroupCommit."""
    db = Database(dsn, min_size=8, max_size=8, timeout_s=10)
    await db.open()
    committer = GroupCommit(
        JobStore(db, node_id="bench", lease_s=30).insert, max_batch=500, flushers=4
    )
    flushing = asyncio.create_task(committer.run())
    ids = JobIds()
    run_at = datetime.now(UTC) + timedelta(days=1)
    took: list[float] = []
    end = time.perf_counter() + seconds

    async def submitter() -> None:
        while (started := time.perf_counter()) < end:
            job_id = ids.next()
            spec = JobSpec(
                routing_key="bench.grouped", payload=b'{"n":1}', run_at=run_at, headers={}
            )
            job = NewJob(id=job_id, shard=shard_for(job_id.bytes, SHARDS), spec=spec)
            await committer.submit(job)
            took.append(time.perf_counter() - started)

    try:
        began = time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(CONCURRENT)))
        elapsed = time.perf_counter() - began
    finally:
        flushing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flushing
        await db.close()
    return len(took) / elapsed, percentile(took, 0.5), percentile(took, 0.99)


def post_single(url: str, connections: int, seconds: int) -> tuple[float, float, float]:
    body = json.dumps({"routing_key": "bench.far", "payload": {"order": 1}, "run_at": far()})
    return wrk(f"{url}/v1/jobs", body, connections=connections, seconds=seconds)


async def main(seconds: int, runs: int) -> None:
    figures: dict[str, list[float]] = {}

    def record(name: str, rate: float, p50: float, p99: float) -> None:
        for suffix, value in (("per_s", rate), ("p50_s", p50), ("p99_s", p99)):
            figures.setdefault(f"{name}_{suffix}", []).append(value)

    with services() as svc, tempfile.TemporaryDirectory() as logs:
        await apply_migrations(svc.database_url)
        with one_node(svc, Path(logs)) as node:
            for _ in range(runs):
                record("insert_commit_each", *await insert_each(svc.database_url, seconds))
                record(
                    "post_sequential", *await asyncio.to_thread(post_single, node.url, 1, seconds)
                )
                record("group_commit_64", *await group_commit(svc.database_url, seconds))
                record(
                    "post_64_clients",
                    *await asyncio.to_thread(post_single, node.url, CONCURRENT, seconds),
                )
    m = {name: median(values) for name, values in figures.items()}
    print(f"Single submit: one job per request (median of {runs} runs of {seconds} s)")
    for name, ceiling in (
        ("post_sequential", "insert_commit_each"),
        ("post_64_clients", "group_commit_64"),
    ):
        print(
            f"  {name:16} {m[f'{name}_per_s']:7.0f}/s p50 {m[f'{name}_p50_s'] * 1000:5.2f} ms"
            f" p99 {m[f'{name}_p99_s'] * 1000:6.2f} ms; {ceiling} {m[f'{ceiling}_per_s']:7.0f}/s"
            f" p50 {m[f'{ceiling}_p50_s'] * 1000:5.2f} ms: "
            f"{m[f'{name}_per_s'] / m[f'{ceiling}_per_s']:.0%} of it"
        )
    result: dict[str, object] = {
        name: {"median": m[name], "runs": values} for name, values in figures.items()
    }
    print(f"  written to {write('single_submit', result)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    harness.run(main(args.seconds, args.runs))
