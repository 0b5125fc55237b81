"""A metered key's rate while another key's backlog drains (``docs/how-to/flow-control.md``).

One node; key ``metered`` has a flow rule of ``--rate`` jobs a second (burst ``--rate`` / 10)
and ``--metered-backlog`` jobs overdue, so its meter always has jobs to let go. Key ``other`` is
paused with ``--overdue`` jobs overdue. After ``--before`` seconds of the metered key alone, the
pause is lifted and the other key's backlog drains (at the catch-up pace); for ``--during``
seconds the metered key's deliveries are counted second by second. Printed: the metered key's
rate before and during the drain (mean, and the worst second), each as a share of its rule's
rate, as the node published it (``dispatched_at``) and as a receiver got it; ``--runs`` times,
medians.

    .venv/bin/python -m bench.metered_rate [--rate 100] [--overdue 60000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx

from bench import harness
from bench.backlog import copy_jobs, receiver
from bench.harness import Services, medians, services, write
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.store.migrate import apply_migrations

TOKEN = "bench-admin-token-0123456789"


async def clear(dsn: str) -> None:
    """No job and no rule of an earlier run left."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("TRUNCATE jobs, flow_rules CASCADE")
    finally:
        await connection.close()


async def set_rules(dsn: str, rate: int) -> None:
    """``metered`` at ``rate`` a second (a tenth of it at once), ``other`` paused."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(
            "INSERT INTO flow_rules (key, paused, note, rate_per_s, burst)"
            " VALUES ('metered', false, 'bench', $1, $2), ('other', true, 'bench', NULL, NULL)",
            float(rate),
            max(1, rate // 10),
        )
    finally:
        await connection.close()


async def marked_per_second(dsn: str, start: float, seconds: int) -> list[int]:
    """The metered key's jobs marked dispatched (RabbitMQ confirmed them) in each whole second
    from ``start``: the node's side, whatever the receiver's own pace on a shared machine."""
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT floor(extract(epoch FROM dispatched_at) - $1)::int AS second, count(*)"
            " FROM jobs WHERE routing_key = 'metered.work' AND dispatched_at IS NOT NULL"
            " GROUP BY 1",
            start,
        )
    finally:
        await connection.close()
    counts = [0] * seconds
    for row in rows:
        if 0 <= row["second"] < seconds:
            counts[row["second"]] = row["count"]
    return counts


async def let_go_each_second(http: httpx.AsyncClient, seconds: int) -> list[int]:
    """How many jobs the node's meter let go in each of the next ``seconds`` seconds (its
    ``dispatcher_flow_let_go_total``, read every second)."""

    async def total() -> float:
        answer = await http.get("/metrics")
        for line in answer.text.splitlines():
            if line.startswith("dispatcher_flow_let_go_total "):
                return float(line.split()[1])
        return 0.0

    counts = []
    last = await total()
    started = time.monotonic()
    for second in range(1, seconds + 1):
        await asyncio.sleep(max(0.0, started + second - time.monotonic()))
        now = await total()
        counts.append(round(now - last))
        last = now
    return counts


def per_second(path: Path, start: float, seconds: int) -> list[int]:
    """Deliveries in each whole second from ``start`` (first deliveries of each job only)."""
    counts = [0] * seconds
    seen: set[str] = set()
    for line in path.read_text().splitlines():
        job_id, at = line.split()
        if job_id in seen:
            continue
        seen.add(job_id)
        second = math.floor(float(at) - start)
        if 0 <= second < seconds:
            counts[second] += 1
    return counts


async def one_run(svc: Services, folder: Path, args: Args, run: int) -> dict[str, float]:
    await clear(svc.database_url)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    minute = timedelta(minutes=1)
    await copy_jobs(svc.database_url, args.metered_backlog, long_ago, minute, "metered.work")
    await copy_jobs(svc.database_url, args.overdue, long_ago, timedelta(minutes=10), "other.work")
    output = folder / f"metered-{run}.txt"
    metered = receiver(svc.amqp_url, "metered.#", output)
    drained = receiver(svc.amqp_url, "other.#", folder / f"other-{run}.txt")
    env = {
        "DISPATCHER_DATABASE_URL": svc.database_url,
        "DISPATCHER_AMQP_URL": svc.amqp_url,
        "DISPATCHER_API_KEYS": f"{TOKEN}:admin",
    }
    # The rules exist before the node fires: neither backlog goes unmetered or unpaused.
    await set_rules(svc.database_url, args.rate)
    node = DispatcherProcess(folder, port=reserve_port(), env=env, name=f"m{run}", api_key=TOKEN)
    try:
        async with httpx.AsyncClient(base_url=node.url, headers=node.auth, timeout=30) as http:
            await asyncio.to_thread(node.start, ready_timeout=120)
            await asyncio.sleep(2.0)  # the bucket's first burst and the catch-up settle
            counting = asyncio.create_task(let_go_each_second(http, args.before + args.during))
            before_at = time.time()
            await asyncio.sleep(args.before)
            released_at = time.time()
            (await http.post("/v1/limits/other/resume")).raise_for_status()
            await asyncio.sleep(args.during + 2.0)  # and the last second's deliveries written
            let_go = await counting
    finally:
        node.stop()
        for process in (metered, drained):
            process.terminate()
            process.wait(30)
    before = per_second(output, before_at, args.before)
    during = per_second(output, released_at, args.during)
    marked_before = await marked_per_second(svc.database_url, before_at, args.before)
    marked_during = await marked_per_second(svc.database_url, released_at, args.during)
    others = sum(1 for _ in (folder / f"other-{run}.txt").read_text().splitlines())
    figures = {
        "let_go_before_mean": sum(let_go[: args.before]) / args.before / args.rate,
        "let_go_during_mean": sum(let_go[args.before :]) / args.during / args.rate,
        "let_go_during_worst": min(let_go[args.before :]) / args.rate,
        "published_before_mean": sum(marked_before) / len(marked_before) / args.rate,
        "published_before_worst": min(marked_before) / args.rate,
        "published_during_mean": sum(marked_during) / len(marked_during) / args.rate,
        "published_during_worst": min(marked_during) / args.rate,
        "before_mean": sum(before) / len(before) / args.rate,
        "before_worst": min(before) / args.rate,
        "during_mean": sum(during) / len(during) / args.rate,
        "during_worst": min(during) / args.rate,
        "other_drained_per_s": others / (args.during + 2.0),
    }
    print(f"run {run}: let go before {let_go[: args.before]}, during {let_go[args.before :]}")
    print(f"run {run}: published before {marked_before}, during {marked_during}")
    print(
        f"run {run}: delivered before {before}, during {during}; "
        + ", ".join(f"{name} {value:.2f}" for name, value in figures.items())
    )
    return figures


@dataclass(frozen=True)
class Args:
    rate: int = 100
    overdue: int = 60_000
    metered_backlog: int = 5_000
    before: int = 10
    during: int = 10
    runs: int = 3


async def main(args: Args) -> None:
    results: dict[str, object] = {"args": dataclasses.asdict(args)}
    with services() as svc, tempfile.TemporaryDirectory() as tmp:
        await apply_migrations(svc.database_url)
        runs = [await one_run(svc, Path(tmp), args, run) for run in range(args.runs)]
    results["medians"] = medians(runs)
    results["runs"] = runs
    path = write("metered_rate", results)
    print(f"\nmetered key at {args.rate}/s while {args.overdue} jobs of another key drain")
    for name, value in medians(runs).items():
        print(f"  {name:24} {value:8.2f}" + ("" if name.startswith("other") else "  x its rate"))
    print(f"written to {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in dataclasses.asdict(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    harness.run(main(Args(**vars(parser.parse_args()))))
