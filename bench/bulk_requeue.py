"""A bulk requeue of ``--dead`` dead jobs while the node fires a steady ``--rate`` of other jobs
(``docs/how-to/bulk-actions.md``): how long the action takes, how soon every requeued job is
delivered, and the lateness of the unrelated jobs (received - run_at) against the same run
without the action, ``--runs`` times each, interleaved.

    .venv/bin/python -m bench.bulk_requeue [--dead 100000] [--rate 1000] [--seconds 45] [--runs 2]
        [--duty 0.5] [--bulk-rate 5000] [--batch 100]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx

from bench import harness
from bench.backlog import SHARDS
from bench.harness import Services, medians, services, started, stopped, summary, write
from bench.lateness import drained, received, steady
from consumers_sdk.ids import JobIds
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.store.migrate import apply_migrations

DEAD_KEY = "bench.dead"
COLUMNS = [
    "id",
    "shard",
    "routing_key",
    "payload",
    "headers",
    "run_at",
    "state",
    "last_error",
    "dispatched_at",
    "updated_at",
]


def dead_since(died: datetime) -> tuple[object, ...]:
    """run_at, state, last_error, dispatched_at, updated_at of a job dead since ``died``."""
    return died, "dead", "HTTP 503 from the bank", died, died


async def copy_dead(dsn: str, count: int) -> None:
    """``count`` jobs that died an hour ago, as a consumer's last failure leaves them."""
    ids, rng = JobIds(), random.Random(1)
    died = datetime.now(UTC) - timedelta(hours=1)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("DELETE FROM jobs WHERE routing_key = $1", DEAD_KEY)
        for first in range(0, count, 10_000):
            records = [
                (ids.next(), rng.randrange(SHARDS), DEAD_KEY, b"1", "{}", *dead_since(died))
                for _ in range(min(10_000, count - first))
            ]
            await connection.copy_records_to_table("jobs", records=records, columns=COLUMNS)
        await connection.execute("ANALYZE jobs")
    finally:
        await connection.close()


async def ended(http: httpx.AsyncClient, path: str) -> dict[str, object]:
    """The action once it is no longer running (looked at every 0.2 s: the bench's own clock)."""
    while True:
        action: dict[str, object] = (await http.get(path)).json()
        if action["status"] != "running":
            return action
        await asyncio.sleep(0.2)


async def requeued(
    node: DispatcherProcess, amqp_url: str, folder: Path, dead: int, run: str
) -> dict[str, float]:
    """Start the requeue; wait for the action to end and every requeued job to arrive."""
    output = folder / f"dead-{run}.txt"
    receiver = started("bench.receiver", amqp_url, DEAD_KEY, str(output))
    try:
        async with httpx.AsyncClient(base_url=node.url, timeout=60) as http:
            begun = time.monotonic()
            body = {"action": "requeue", "filter": {"routing_key": DEAD_KEY}}
            answer = await http.post("/v1/bulk-actions", json=body)
            answer.raise_for_status()
            path = f"/v1/bulk-actions/{answer.json()['id']}"
            action = await ended(http, path)
            took_s = time.monotonic() - begun
            await drained(output, dead, deadline_s=300)
            delivered_s = time.monotonic() - begun
    finally:
        stopped(receiver)
    return {
        "action_s": took_s,
        "all_delivered_s": delivered_s,
        "touched": float(str(action["touched"])),
        "delivered": float(len(received(output))),
    }


async def lateness_run(
    node: DispatcherProcess,
    svc: Services,
    folder: Path,
    rate: int,
    seconds: float,
    run: str,
    dead: int = 0,
) -> tuple[dict[str, float], dict[str, float] | None]:
    """The steady load's lateness; with ``dead``, and what a bulk requeue of that many dead jobs
    started 5 s into it took."""
    output = folder / f"steady-{run}.txt"
    receiver = started("bench.receiver", svc.amqp_url, "bench.steady", str(output))
    action = None
    try:
        load = asyncio.create_task(steady(node.url, rate, seconds))
        if dead:
            await copy_dead(svc.database_url, dead)
            await asyncio.sleep(5)
            action = await requeued(node, svc.amqp_url, folder, dead, run)
        accepted = await load
        await drained(output, len(accepted), deadline_s=180)
    finally:
        stopped(receiver)
    got = received(output)
    stats = summary([got[job] - due for job, due in accepted.items() if job in got])
    stats["lost"] = len(accepted) - stats["n"]
    return stats, action


async def main(
    dead: int, rate: int, seconds: float, runs: int, duty: float, bulk_rate: float, batch: int
) -> None:
    results: dict[str, object] = {
        "dead": dead,
        "rate": rate,
        "seconds": seconds,
        "runs": runs,
        "duty": duty,
        "bulk_rate": bulk_rate,
        "batch": batch,
    }
    with services() as svc, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await apply_migrations(svc.database_url)
        env = {
            "DISPATCHER_DATABASE_URL": svc.database_url,
            "DISPATCHER_AMQP_URL": svc.amqp_url,
            "DISPATCHER_BULK_DUTY": str(duty),
            "DISPATCHER_BULK_RATE_PER_S": str(bulk_rate),
            "DISPATCHER_BULK_BATCH": str(batch),
        }
        node = DispatcherProcess(folder, port=reserve_port(), env=env, name="bulk")
        node.start()
        plain: list[dict[str, float]] = []
        bulk: list[dict[str, float]] = []
        actions: list[dict[str, float]] = []
        try:
            await lateness_run(node, svc, folder, rate, 10, "warm-up")  # a fresh node's first
            for run in range(runs):
                stats, _ = await lateness_run(node, svc, folder, rate, seconds, f"plain-{run}")
                plain.append(stats)
                print(f"    without: p99 {stats['p99'] * 1000:.1f} ms", flush=True)
                stats, action = await lateness_run(
                    node, svc, folder, rate, seconds, f"bulk-{run}", dead
                )
                assert action is not None
                bulk.append(stats)
                actions.append(action)
                print(f"    with:    p99 {stats['p99'] * 1000:.1f} ms, {action}", flush=True)
        finally:
            node.stop()
    m_plain, m_bulk = medians(plain), medians(bulk)
    took = harness.median([action["action_s"] for action in actions])
    delivered = harness.median([action["all_delivered_s"] for action in actions])
    results.update(
        plain=plain, bulk=bulk, actions=actions, p99_ratio=m_bulk["p99"] / m_plain["p99"]
    )
    print(
        f"  requeue of {dead:,} dead jobs: the action took {took:.1f} s, every job delivered"
        f" {delivered:.1f} s after it started; unrelated jobs at {rate}/s: p50"
        f" {m_plain['p50'] * 1000:.1f} -> {m_bulk['p50'] * 1000:.1f} ms, p99"
        f" {m_plain['p99'] * 1000:.1f} -> {m_bulk['p99'] * 1000:.1f} ms"
        f" ({m_bulk['p99'] / m_plain['p99']:.2f}x; medians of {runs})",
        flush=True,
    )
    print(f"  written to {write('bulk_requeue', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--duty", type=float, default=0.5, help="DISPATCHER_BULK_DUTY")
    parser.add_argument("--bulk-rate", type=float, default=5000, help="DISPATCHER_BULK_RATE_PER_S")
    parser.add_argument("--batch", type=int, default=100, help="DISPATCHER_BULK_BATCH")
    args = parser.parse_args()
    print("bulk requeue: dead jobs back on the schedule while the node fires on time")
    harness.run(
        main(args.dead, args.rate, args.seconds, args.runs, args.duty, args.bulk_rate, args.batch)
    )
