"""Fairness and catch-up: two lateness figures side by side in each scenario.

- burst: ``--burst`` jobs of one routing key due at one instant, while another key has jobs due
  every 20 ms: the small key's lateness next to the burst's, and how fast the burst drains.
- catch-up: ``--overdue`` jobs fell due while no dispatcher ran; it starts with
  ``DISPATCHER_CATCHUP_MAX_RATE``: the drain rate it keeps, next to the lateness of jobs falling
  due meanwhile.

    .venv/bin/python -m bench.fairness [--burst 100000] [--overdue 20000] [--rate 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from bench import harness
from bench.backlog import copy_jobs, finish_when_drained, receiver
from bench.harness import Services, medians, services, summary, write
from bench.lateness import received
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.store.migrate import apply_migrations

TRICKLE_EVERY_S = 0.02


async def trickle(url: str, key: str, start: float, seconds: float) -> dict[str, float]:
    """Jobs of ``key`` due every 20 ms from ``start`` for ``seconds``, each submitted half a
    second ahead; id -> run_at."""
    accepted: dict[str, float] = {}
    per_batch = int(0.5 / TRICKLE_EVERY_S)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        first = start
        while first < start + seconds:
            await asyncio.sleep(max(0.0, first - 0.5 - time.time()))
            jobs = [
                {
                    "routing_key": key,
                    "payload": i,
                    "run_at": datetime.fromtimestamp(first + i * TRICKLE_EVERY_S, UTC).isoformat(),
                }
                for i in range(per_batch)
            ]
            response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
            response.raise_for_status()
            for job in response.json()["jobs"]:
                accepted[job["id"]] = datetime.fromisoformat(job["run_at"]).timestamp()
            first += per_batch * TRICKLE_EVERY_S
    return accepted


def lateness(path: Path, due: dict[str, float]) -> dict[str, float]:
    got = received(path)
    stats = summary([got[job_id] - run_at for job_id, run_at in due.items() if job_id in got])
    stats["lost"] = len(due) - int(stats["n"])
    return stats


async def burst_run(svc: Services, folder: Path, burst: int, run: int) -> dict[str, float]:
    big, small = f"bench.burst.{run}", f"bench.small.{run}"
    env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
    big_file, small_file = folder / f"big-{run}.txt", folder / f"small-{run}.txt"
    listening = [receiver(svc.amqp_url, big, big_file), receiver(svc.amqp_url, small, small_file)]
    # Stored before the node starts, which loads it into the live lane before it falls due.
    burst_at = time.time() + 20
    await copy_jobs(
        svc.database_url, burst, datetime.fromtimestamp(burst_at, UTC), timedelta(0), big
    )
    node = DispatcherProcess(folder, port=reserve_port(), env=env, name=f"burst-{run}")
    node.start()
    small_due = await trickle(node.url, small, burst_at - 2, 30)
    await finish_when_drained(svc.database_url, big, node, listening)
    got = received(big_file)
    big_late = lateness(big_file, dict.fromkeys(got, burst_at))
    small_late = lateness(small_file, small_due)
    return {
        "burst_drain_s": max(got.values()) - burst_at,
        "burst_jobs_s": burst / (max(got.values()) - burst_at),
        "burst_p50_s": big_late["p50"],
        "small_p50_s": small_late["p50"],
        "small_p99_s": small_late["p99"],
        "small_max_s": small_late["max"],
        "small_lost": small_late["lost"],
    }


async def catchup_run(
    svc: Services, folder: Path, overdue: int, rate: int, run: int
) -> dict[str, float]:
    key, fresh_key = f"bench.behind.{run}", f"bench.now.{run}"
    env = {
        "DISPATCHER_DATABASE_URL": svc.database_url,
        "DISPATCHER_AMQP_URL": svc.amqp_url,
        "DISPATCHER_CATCHUP_MAX_RATE": str(rate),
    }
    behind_file, fresh_file = folder / f"behind-{run}.txt", folder / f"now-{run}.txt"
    listening = [
        receiver(svc.amqp_url, key, behind_file),
        receiver(svc.amqp_url, fresh_key, fresh_file),
    ]
    downtime = timedelta(minutes=10)
    await copy_jobs(svc.database_url, overdue, datetime.now(UTC) - downtime, downtime, key)
    node = DispatcherProcess(folder, port=reserve_port(), env=env, name=f"catchup-{run}")
    node.start()
    started = time.time()
    fresh_due = await trickle(node.url, fresh_key, started + 1, overdue / rate * 0.8)
    await finish_when_drained(svc.database_url, key, node, listening)
    got = received(behind_file)
    fresh = lateness(fresh_file, fresh_due)
    # The bucket starts full (one batch of 500): that many may go at once, the rest at the rate.
    times = sorted(got.values())
    return {
        "drain_s": times[-1] - started,
        "drain_jobs_s": (len(times) - 500) / (times[-1] - times[0]),
        "fresh_p50_s": fresh["p50"],
        "fresh_p99_s": fresh["p99"],
        "fresh_max_s": fresh["max"],
        "fresh_lost": fresh["lost"],
    }


async def main(burst: int, overdue: int, rate: int, runs: int = 3) -> None:
    results: dict[str, object] = {"burst": burst, "overdue": overdue, "rate": rate, "runs": runs}
    with services() as svc, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await apply_migrations(svc.database_url)  # the jobs are stored before a node starts
        each = [await burst_run(svc, folder, burst, run) for run in range(runs)]
        m = medians(each)
        results["burst_runs"] = {"median": m, "runs": each}
        print(
            f"  burst of {burst} on one key: drained in {m['burst_drain_s']:.1f}s "
            f"({m['burst_jobs_s']:.0f} jobs/s, burst p50 lateness {m['burst_p50_s']:.1f}s); "
            f"another key due every 20 ms meanwhile: p50 {m['small_p50_s'] * 1000:.0f} ms "
            f"p99 {m['small_p99_s'] * 1000:.0f} ms max {m['small_max_s'] * 1000:.0f} ms "
            f"(median of {runs}; not received {sum(r['small_lost'] for r in each):.0f})",
            flush=True,
        )
        each = [await catchup_run(svc, folder, overdue, rate, run) for run in range(runs)]
        m = medians(each)
        results["catchup_runs"] = {"median": m, "runs": each}
        print(
            f"  catch-up of {overdue} overdue at DISPATCHER_CATCHUP_MAX_RATE={rate}: "
            f"{m['drain_jobs_s']:.0f} jobs/s, drained in {m['drain_s']:.1f}s; jobs due "
            f"meanwhile: p50 {m['fresh_p50_s'] * 1000:.0f} ms p99 {m['fresh_p99_s'] * 1000:.0f} ms"
            f" max {m['fresh_max_s'] * 1000:.0f} ms (median of {runs}; not received "
            f"{sum(r['fresh_lost'] for r in each):.0f})",
            flush=True,
        )
    print(f"  written to {write('fairness', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=100_000)
    parser.add_argument("--overdue", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=1000, help="DISPATCHER_CATCHUP_MAX_RATE")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("fairness between routing keys, and catch-up at a maximum rate")
    harness.run(main(args.burst, args.overdue, args.rate, args.runs))
