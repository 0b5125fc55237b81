"""Memory with a big backlog, start-up to first fire, and catch-up after downtime.

    .venv/bin/python -m bench.backlog [--rows 1000000 10000000] [--overdue 200000] [--runs 3]

1. For each backlog size, that many jobs spread over a day (from an hour ahead) are in
   PostgreSQL; a dispatcher starts: its RSS over 30 s (it must stay flat, bounded by the heap cap)
   and the time from process start until a job due at start is in RabbitMQ.
2. With the largest backlog in place, the dispatcher is stopped while ``overdue`` jobs fall due;
   it starts again: the time to drain them, and the lateness of new jobs due every 50 ms
   meanwhile (they must not wait for the drain).
Every figure is the median of ``runs`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx

from bench import harness
from bench.harness import Services, medians, services, summary, write
from bench.lateness import received
from consumers_sdk.ids import JobIds
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.store.migrate import apply_migrations

SHARDS = 256
# $1 routing key.
UNDRAINED = "SELECT count(*) FROM jobs WHERE routing_key = $1 AND state <> 'dispatched'"


async def copy_jobs(dsn: str, count: int, start: datetime, span: timedelta, key: str) -> None:
    ids = JobIds()
    rng = random.Random(1)
    connection = await asyncpg.connect(dsn)
    try:
        for first in range(0, count, 10_000):
            size = min(10_000, count - first)
            run_ats = sorted(start + span * rng.random() for _ in range(size))
            records = [
                (ids.next(), rng.randrange(SHARDS), key, b'{"n":1}', "{}", run_at)
                for run_at in run_ats
            ]
            await connection.copy_records_to_table(
                "jobs",
                records=records,
                columns=["id", "shard", "routing_key", "payload", "headers", "run_at"],
            )
        await connection.execute("ANALYZE jobs")
    finally:
        await connection.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def receiver(amqp_url: str, binding: str, output: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.receiver", amqp_url, binding, str(output)],
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.readline()
    return process


async def finish_when_drained(
    dsn: str, key: str, node: DispatcherProcess, receivers: list[subprocess.Popen[bytes]]
) -> None:
    """Wait until every job of ``key`` is dispatched, give late deliveries 3 s to arrive, then
    stop the node and the receivers."""
    connection = await asyncpg.connect(dsn)
    try:
        while await connection.fetchval(UNDRAINED, key):  # noqa: ASYNC110 - state in PostgreSQL
            await asyncio.sleep(0.5)
    finally:
        await connection.close()
    await asyncio.sleep(3)
    node.stop()
    for process in receivers:
        process.terminate()
        process.wait(30)


async def memory_run(svc: Services, folder: Path, run: str) -> dict[str, float]:
    """Start a dispatcher over the backlog: RSS for 30 s, and start-up to the first fire."""
    env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
    output = folder / f"received-{run}.txt"
    listening = receiver(svc.amqp_url, f"bench.now.{run}", output)
    await copy_jobs(svc.database_url, 100, datetime.now(UTC), timedelta(0), f"bench.now.{run}")
    node = DispatcherProcess(folder, port=reserve_port(), env=env)
    launched = time.time()
    node.start()
    samples = []
    for _ in range(60):
        samples.append(rss_mb(node.pid))
        await asyncio.sleep(0.5)
    node.stop()
    listening.terminate()
    listening.wait(30)
    return {
        "rss_first_mb": samples[0],
        "rss_max_mb": max(samples),
        "rss_last_mb": samples[-1],
        "first_fire_s": min(received(output).values()) - launched,
    }


async def catchup_run(svc: Services, folder: Path, overdue: int, run: int) -> dict[str, float]:
    """Stopped while ``overdue`` jobs fell due, then started: drain time, and the lateness of
    jobs falling due every 50 ms meanwhile."""
    env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
    key = f"bench.overdue.{run}"
    await copy_jobs(
        svc.database_url,
        overdue,
        datetime.now(UTC) - timedelta(minutes=10),
        timedelta(minutes=10),
        key,
    )
    overdue_file = folder / f"overdue-{run}.txt"
    fresh_file = folder / f"fresh-{run}.txt"
    listening = [
        receiver(svc.amqp_url, key, overdue_file),
        receiver(svc.amqp_url, f"bench.fresh.{run}", fresh_file),
    ]
    node = DispatcherProcess(folder, port=reserve_port(), env=env)
    node.start()
    restarted = time.time()
    fresh: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=node.url, timeout=30) as http:
        for step in range(0, 400, 20):
            run_at = restarted + 1 + step * 0.05
            jobs = [
                {
                    "routing_key": f"bench.fresh.{run}",
                    "payload": i,
                    "run_at": datetime.fromtimestamp(run_at + i * 0.05, UTC).isoformat(),
                }
                for i in range(20)
            ]
            response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
            for job in response.json()["jobs"]:
                fresh[job["id"]] = datetime.fromisoformat(job["run_at"]).timestamp()
            await asyncio.sleep(max(0.0, run_at - 0.5 - time.time()))
    await finish_when_drained(svc.database_url, key, node, listening)
    drained = max(received(overdue_file).values()) - restarted
    got = received(fresh_file)
    late = summary([got[job_id] - run_at for job_id, run_at in fresh.items() if job_id in got])
    return {
        "drain_s": drained,
        "drain_jobs_s": overdue / drained,
        "fresh_p50_s": late["p50"],
        "fresh_p99_s": late["p99"],
        "fresh_max_s": late["max"],
    }


async def main(rows: list[int], overdue: int, runs: int = 3) -> None:
    results: dict[str, object] = {"overdue": overdue, "runs": runs}
    with services() as svc, tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        await apply_migrations(svc.database_url)
        loaded = 0
        for count in sorted(rows):
            started = time.perf_counter()
            await copy_jobs(
                svc.database_url,
                count - loaded,
                datetime.now(UTC) + timedelta(hours=1),
                timedelta(days=1),
                "bench.later",
            )
            loaded = count
            print(f"  {count} scheduled jobs ({time.perf_counter() - started:.0f}s to load)")
            each = [await memory_run(svc, folder, f"{count}-{run}") for run in range(runs)]
            m = medians(each)
            results[f"backlog_{count}"] = {"median": m, "runs": each}
            print(
                f"  with {count} scheduled: RSS {m['rss_first_mb']:.0f} MB at start, max "
                f"{m['rss_max_mb']:.0f} MB, {m['rss_last_mb']:.0f} MB after 30 s; first fire "
                f"{m['first_fire_s']:.2f}s after process start (median of {runs})",
                flush=True,
            )
        if not overdue:
            print(f"  written to {write('backlog', results)}")
            return
        each = [await catchup_run(svc, folder, overdue, run) for run in range(runs)]
        m = medians(each)
        results["catchup"] = {"median": m, "runs": each}
        print(
            f"  catch-up: {overdue} overdue drained {m['drain_s']:.1f}s after restart "
            f"({m['drain_jobs_s']:.0f} jobs/s); jobs due meanwhile: lateness p50 "
            f"{m['fresh_p50_s'] * 1000:.0f} ms p99 {m['fresh_p99_s'] * 1000:.0f} ms max "
            f"{m['fresh_max_s'] * 1000:.0f} ms (median of {runs})",
            flush=True,
        )
    print(f"  written to {write('backlog', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--overdue", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("backlog memory, start-up and catch-up")
    harness.run(main(args.rows, args.overdue, args.runs))
