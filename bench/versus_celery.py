"""The same schedule through Celery's countdown and through the dispatcher, on the same RabbitMQ:
submit rate, lateness, the consumer's memory while jobs wait, and jobs lost when the worker or
consumer is killed with -9 halfway and restarted.

    .venv/bin/python -m bench.versus_celery [--jobs 20000] [--runs 3]

Jobs are due uniformly 10 to 30 s after submission starts; Celery runs one worker (threads pool,
concurrency 4), the dispatcher one SDK consumer (prefetch 64).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench import harness
from bench.backlog import rss_mb
from bench.harness import Services, median, services, summary, write
from bench.lateness import received
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def schedule_plan(count: int, start: float) -> list[tuple[str, float]]:
    return [(str(uuid.uuid4()), start + 10 + 20 * i / count) for i in range(count)]


def tally(results_file: Path) -> tuple[dict[str, float], int]:
    """First receipt per id, and how many receipts in all."""
    if not results_file.exists():
        return {}, 0
    return received(results_file), len(results_file.read_text().splitlines())


async def run_side(
    name: str,
    plan: list[tuple[str, float]],
    submit: Callable[[list[tuple[str, float]]], None],
    start_consumer: Callable[[], subprocess.Popen[bytes]],
    results_file: Path,
) -> dict[str, object]:
    consumer = start_consumer()
    await asyncio.sleep(3)
    began = time.perf_counter()
    await asyncio.to_thread(submit, plan)
    submit_rate = len(plan) / (time.perf_counter() - began)
    peak = 0.0
    halfway = plan[len(plan) // 2][1]
    while time.time() < halfway:
        peak = max(peak, rss_mb(consumer.pid))
        await asyncio.sleep(0.2)
    os.killpg(consumer.pid, signal.SIGKILL)
    consumer.wait(10)
    consumer = start_consumer()
    await asyncio.sleep(max(0.0, plan[-1][1] - time.time()) + 15)
    os.killpg(consumer.pid, signal.SIGTERM)
    consumer.wait(30)
    got, lines = await asyncio.to_thread(tally, results_file)
    ids = {job_id for job_id, _ in plan}
    late = [got[job_id] - run_at for job_id, run_at in plan if job_id in got]
    stats = summary(late)
    result: dict[str, object] = {
        "submit_jobs_s": submit_rate,
        "lateness_s": stats,
        "peak_consumer_rss_mb_while_waiting": peak,
        "lost_after_kill_9": len(ids - got.keys()),
        "duplicates": lines - len(got),
    }
    print(
        f"  {name:10} submit {submit_rate:7.0f} jobs/s  lateness p50 {stats['p50'] * 1000:7.0f} ms"
        f"  p99 {stats['p99'] * 1000:7.0f} ms  consumer RSS while waiting {peak:5.0f} MB"
        f"  lost {result['lost_after_kill_9']}  duplicates {result['duplicates']}",
        flush=True,
    )
    return result


async def one_round(
    svc: Services, folder: str, count: int, run: int
) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    # Celery: countdown tasks, one worker.
    celery_results = Path(folder) / f"celery-{run}.txt"
    env = {"AMQP_URL": svc.amqp_url, "RESULTS_FILE": str(celery_results)}
    os.environ.update(env)
    from bench.celery_app import record

    def celery_submit(plan: list[tuple[str, float]]) -> None:
        for job_id, run_at in plan:
            record.apply_async(args=[job_id], countdown=run_at - time.time())

    celery_bin = str(Path(sys.executable).parent / "celery")
    results["celery"] = await run_side(
        "celery",
        schedule_plan(count, time.time()),
        celery_submit,
        lambda: spawn(
            [
                celery_bin,
                "-A",
                "bench.celery_app",
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                "4",
                "--loglevel",
                "warning",
            ],
            env,
        ),
        celery_results,
    )

    # The dispatcher: batch POSTs, one SDK consumer.
    node = DispatcherProcess(
        Path(folder),
        port=reserve_port(),
        env={"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url},
    )
    node.start()
    sdk_results = Path(folder) / f"sdk-{run}.txt"

    def dispatcher_submit(plan: list[tuple[str, float]]) -> None:
        with httpx.Client(base_url=node.url, timeout=60) as http:
            for first in range(0, len(plan), 1000):
                jobs = [
                    {
                        "routing_key": "bench.versus",
                        "payload": None,
                        "run_at": datetime.fromtimestamp(run_at, UTC).isoformat(),
                        "idempotency_key": job_id,
                    }
                    for job_id, run_at in plan[first : first + 1000]
                ]
                http.post("/v1/jobs/batch", json={"jobs": jobs}).raise_for_status()

    plan = schedule_plan(count, time.time())
    sdk_env = {"AMQP_URL": svc.amqp_url, "RESULTS_FILE": str(sdk_results)}
    try:
        outcome = await run_side(
            "dispatcher",
            plan,
            dispatcher_submit,
            lambda: spawn(
                [sys.executable, "-m", "consumers_sdk", "bench.sdk_consumer:consumer"], sdk_env
            ),
            sdk_results,
        )
    finally:
        node.stop()
    results["dispatcher"] = outcome
    return results


def _median_of(runs: list[dict[str, object]], key: str) -> object:
    values = [run[key] for run in runs]
    if isinstance(values[0], dict):
        return {k: median([float(v[k]) for v in values]) for k in values[0]}  # type: ignore[index]
    return median([float(v) for v in values])  # type: ignore[arg-type]


async def main(count: int, runs: int = 3) -> None:
    results: dict[str, object] = {"jobs": count, "runs": runs}
    with services() as svc, tempfile.TemporaryDirectory() as folder:
        rounds = [await one_round(svc, folder, count, run) for run in range(runs)]
    for side in ("celery", "dispatcher"):
        each = [one[side] for one in rounds]
        m = {key: _median_of(each, key) for key in each[0]}
        results[side] = {"median": m, "runs": each}
        late = m["lateness_s"]
        assert isinstance(late, dict)
        print(
            f"  {side:10} median of {runs}: submit {m['submit_jobs_s']:7.0f} jobs/s  lateness p50 "
            f"{late['p50'] * 1000:6.0f} ms  p99 {late['p99'] * 1000:6.0f} ms  consumer RSS "
            f"{m['peak_consumer_rss_mb_while_waiting']:4.0f} MB  lost (sum) "
            f"{sum(int(str(run['lost_after_kill_9'])) for run in each)}  duplicates (sum) "
            f"{sum(int(str(run['duplicates'])) for run in each)}",
            flush=True,
        )
    print(f"  written to {write('versus_celery', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"versus Celery: {args.jobs} jobs due 10-30 s ahead, worker/consumer killed -9 halfway")
    harness.run(main(args.jobs, args.runs))
