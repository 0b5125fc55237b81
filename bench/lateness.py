"""Firing lateness under a steady load: jobs due at 1k/s and at 5k/s for a fixed time, a consumer
(in its own process) draining; lateness = received - run_at.

    .venv/bin/python -m bench.lateness [--seconds 60] [--rates 1000 5000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench import harness
from bench.harness import medians, services_with_node, started, stopped, summary, write
from devstack.dispatcher_process import DispatcherProcess


async def steady(
    url: str, rate: int, seconds: float, routing_key: str = "bench.steady"
) -> dict[str, float]:
    """Submit, one second ahead, jobs due evenly at ``rate`` per second; id -> run_at."""
    accepted: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        slot = time.time() + 2.0
        end = slot + seconds
        while slot < end:
            await asyncio.sleep(max(0.0, slot - 1.0 - time.time()))
            for first in range(0, rate, 1000):
                jobs = [
                    {
                        "routing_key": routing_key,
                        "payload": i,
                        "run_at": datetime.fromtimestamp(slot + i / rate, UTC).isoformat(),
                    }
                    for i in range(first, min(first + 1000, rate))
                ]
                response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
                response.raise_for_status()
                for job in response.json()["jobs"]:
                    accepted[job["id"]] = datetime.fromisoformat(job["run_at"]).timestamp()
            slot += 1.0
    return accepted


async def drained(output: Path, expected: int, deadline_s: float) -> None:
    """Wait until the receiver has written ``expected`` lines (or the deadline passed)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if await asyncio.to_thread(_lines, output) >= expected:
            return
        await asyncio.sleep(1)


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def received(path: Path) -> dict[str, float]:
    first: dict[str, float] = {}
    for line in path.read_text().splitlines():
        job_id, at = line.split()
        first.setdefault(job_id, float(at))
    return first


async def one_run(
    node: DispatcherProcess, amqp_url: str, folder: Path, rate: int, seconds: float, run: int
) -> dict[str, float]:
    output = folder / f"received-{rate}-{run}.txt"
    receiver = started("bench.receiver", amqp_url, "bench.steady", str(output))
    try:
        accepted = await steady(node.url, rate, seconds)
        await drained(output, len(accepted), deadline_s=180)
    finally:
        stopped(receiver)
    got = received(output)
    late = [got[job_id] - run_at for job_id, run_at in accepted.items() if job_id in got]
    stats = summary(late)
    stats["lost"] = len(accepted) - len(late)
    return stats


async def main(seconds: float, rates: list[int], runs: int = 3) -> None:
    results: dict[str, object] = {"seconds": seconds, "runs": runs}
    with services_with_node() as (svc, folder, node):
        for rate in rates:
            each = [
                await one_run(node, svc.amqp_url, folder, rate, seconds, run) for run in range(runs)
            ]
            stats = medians(each)
            results[f"rate_{rate}"] = {"median": stats, "runs": each}
            print(
                f"  {rate:5}/s for {seconds:.0f}s: lateness p50 {stats['p50'] * 1000:6.1f} ms"
                f"  p99 {stats['p99'] * 1000:7.1f} ms  max {stats['max'] * 1000:7.1f} ms"
                f"  (median of {runs} runs; p99 of each: "
                + ", ".join(f"{run['p99'] * 1000:.0f}" for run in each)
                + f" ms; not received {sum(run['lost'] for run in each):.0f})",
                flush=True,
            )
    print(f"  written to {write('lateness', results)}")


def rates_and_runs() -> argparse.Namespace:
    """The command line of a steady-load benchmark: --seconds, --rates, --runs, --results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rates", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--results", help="the results file's name under bench/results/")
    return parser.parse_args()


if __name__ == "__main__":
    args = rates_and_runs()
    print(f"firing lateness, steady load, {args.seconds:.0f}s per rate and run")
    harness.run(main(args.seconds, args.rates, args.runs))
