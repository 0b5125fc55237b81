"""Memory with a big backlog, start-up to first fire, and catch-up after downtime.

    .venv/bin/python -m bench.backlog [--rows 1000000] [--overdue 200000]

1. ``rows`` scheduled jobs spread over the next day are in PostgreSQL; a dispatcher starts:
   its RSS over 30 s (it must stay flat, bounded by the heap cap) and the time from process start
   until a job due at start is in RabbitMQ.
2. The dispatcher is stopped while ``overdue`` jobs fall due; it starts again: the time to drain
   them, and the lateness of new jobs due every 50 ms meanwhile (they must not wait for the drain).
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

from bench.harness import services, summary, write
from bench.lateness import received
from dispatcher.models import JobIds
from dispatcher.store.migrate import apply_migrations
from tests.services.ports import free_port
from tests.support.process import DispatcherProcess

SHARDS = 256
UNDRAINED = (
    "SELECT count(*) FROM jobs WHERE routing_key = 'bench.overdue' AND state <> 'dispatched'"
)


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


async def main(rows: int, overdue: int) -> None:
    results: dict[str, object] = {"rows": rows, "overdue": overdue}
    with services() as svc, tempfile.TemporaryDirectory() as folder:
        await apply_migrations(svc.database_url)
        started = time.perf_counter()
        await copy_jobs(
            svc.database_url,
            rows,
            datetime.now(UTC) + timedelta(minutes=5),
            timedelta(days=1),
            "bench.later",
        )
        print(f"  loaded {rows} scheduled jobs in {time.perf_counter() - started:.1f}s", flush=True)
        env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
        output = Path(folder) / "received.txt"
        listening = receiver(svc.amqp_url, "bench.now", output)
        await copy_jobs(svc.database_url, 100, datetime.now(UTC), timedelta(0), "bench.now")
        node = DispatcherProcess(Path(folder), port=free_port(), env=env)
        launched = time.time()
        node.start()
        samples = []
        for _ in range(60):
            samples.append(rss_mb(node.pid))
            await asyncio.sleep(0.5)
        listening.terminate()
        listening.wait(30)
        first_fire = min(received(output).values()) - launched
        results["rss_mb"] = {"first": samples[0], "max": max(samples), "last": samples[-1]}
        results["first_fire_s"] = first_fire
        print(
            f"  with {rows} scheduled: RSS {samples[0]:.0f} MB at start, max {max(samples):.0f} MB,"
            f" {samples[-1]:.0f} MB after 30 s; first fire {first_fire:.2f}s after process start",
            flush=True,
        )

        # 2. downtime, then catch-up
        node.stop()
        await copy_jobs(
            svc.database_url,
            overdue,
            datetime.now(UTC) - timedelta(minutes=10),
            timedelta(minutes=10),
            "bench.overdue",
        )
        output = Path(folder) / "catchup.txt"
        listening = receiver(svc.amqp_url, "bench.#", output)
        node.start()
        restarted = time.time()
        fresh: dict[str, float] = {}
        async with httpx.AsyncClient(base_url=node.url, timeout=30) as http:
            for step in range(400):
                run_at = restarted + 1 + step * 0.05
                if step % 20 == 0:
                    jobs = [
                        {
                            "routing_key": "bench.fresh",
                            "payload": i,
                            "run_at": datetime.fromtimestamp(run_at + i * 0.05, UTC).isoformat(),
                        }
                        for i in range(20)
                    ]
                    response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
                    for job in response.json()["jobs"]:
                        fresh[job["id"]] = datetime.fromisoformat(job["run_at"]).timestamp()
                    await asyncio.sleep(max(0.0, run_at - 0.5 - time.time()))
        connection = await asyncpg.connect(svc.database_url)
        try:
            while await connection.fetchval(UNDRAINED):  # noqa: ASYNC110 - state in PostgreSQL
                await asyncio.sleep(0.5)
        finally:
            await connection.close()
        await asyncio.sleep(3)
        listening.terminate()
        listening.wait(30)
        got = received(output)
        drained = max(got.values()) - restarted
        late = [got[job_id] - run_at for job_id, run_at in fresh.items() if job_id in got]
        results["catchup_drain_s"] = drained
        results["fresh_lateness_during_drain_s"] = summary(late)
        stats = summary(late)
        print(
            f"  catch-up: {overdue} overdue drained {drained:.1f}s after restart "
            f"({overdue / drained:.0f} jobs/s); jobs due meanwhile: lateness p50 "
            f"{stats['p50'] * 1000:.0f} ms p99 {stats['p99'] * 1000:.0f} ms max "
            f"{stats['max'] * 1000:.0f} ms (n={stats['n']:.0f})",
            flush=True,
        )
        node.stop()
    print(f"  written to {write('backlog', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--overdue", type=int, default=200_000)
    args = parser.parse_args()
    print("backlog memory, start-up and catch-up")
    asyncio.run(main(args.rows, args.overdue))
