"""Dry runs of bulk actions as a hostile producer sends them: ``--clients`` clients each sending
``POST /v1/bulk-actions`` dry runs back to back for ``--seconds`` over ``--jobs`` scheduled jobs,
while the node fires a steady ``--rate`` of other jobs and one more client submits single jobs
and asks ``/readyz``. Against the same run without the dry runs, ``--runs`` times each,
interleaved: the other submits' latency, ``/readyz``'s answers, and the firing lateness.

    .venv/bin/python -m bench.bulk_reads [--jobs 1000000] [--clients 64] [--seconds 60]
        [--rate 500] [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections import Counter
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

BACKLOG_KEY = "bench.backlog"
# What the clients ask, in turn: every scheduled job (the probe's), and those of one prefix.
FILTERS = [{"state": "scheduled"}, {"state": "scheduled", "routing_key_prefix": "bench"}]


async def copy_backlog(dsn: str, count: int) -> None:
    """``count`` jobs scheduled a day from now."""
    ids, rng = JobIds(), random.Random(1)
    due = datetime.now(UTC) + timedelta(days=1)
    connection = await asyncpg.connect(dsn)
    try:
        for first in range(0, count, 10_000):
            records = [
                (ids.next(), rng.randrange(SHARDS), BACKLOG_KEY, b"1", "{}", due)
                for _ in range(min(10_000, count - first))
            ]
            await connection.copy_records_to_table(
                "jobs",
                records=records,
                columns=["id", "shard", "routing_key", "payload", "headers", "run_at"],
            )
        await connection.execute("ANALYZE jobs")
    finally:
        await connection.close()


async def dry_runs(http: httpx.AsyncClient, end: float, number: int, answers: Counter[int]) -> None:
    """One client's dry runs until ``end`` (a connection of its own in the shared pool); a 429
    is waited out as its Retry-After says."""
    body = {"action": "cancel", "dry_run": True, "filter": FILTERS[number % len(FILTERS)]}
    while time.monotonic() < end:
        answer = await http.post("/v1/bulk-actions", json=body)
        answers[answer.status_code] += 1
        if answer.status_code == 429:
            await asyncio.sleep(float(answer.headers.get("retry-after", "1")))


async def probe(url: str, end: float) -> tuple[list[float], Counter[int]]:
    """Single submits, five a second, each timed; and /readyz twice a second, its answers."""
    submits: list[float] = []
    ready: Counter[int] = Counter()
    body = {"routing_key": "bench.probe", "payload": 1, "delay_ms": 86_400_000}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        tick = 0
        while time.monotonic() < end:
            began = time.monotonic()
            answer = await http.post("/v1/jobs", json=body)
            submits.append(time.monotonic() - began)
            answer.raise_for_status()
            if tick % 2 == 0:
                ready[(await http.get("/readyz")).status_code] += 1
            tick += 1
            await asyncio.sleep(max(0.0, began + 0.2 - time.monotonic()))
    return submits, ready


async def one_run(
    node: DispatcherProcess, svc: Services, folder: Path, args: argparse.Namespace, run: str
) -> dict[str, float]:
    """The steady load's lateness, the probe's figures, and (with clients) the dry runs'."""
    output = folder / f"steady-{run}.txt"
    receiver = started("bench.receiver", svc.amqp_url, "bench.steady", str(output))
    clients = args.clients if run.startswith("dry") else 0
    answers: Counter[int] = Counter()
    # One client for the readers, made before the clock starts: 64 clients made at once cost the
    # bench's own loop over a second (each loads the CA certificates), which the probe measured.
    unbounded = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    try:
        async with httpx.AsyncClient(base_url=node.url, timeout=60, limits=unbounded) as shared:
            load = asyncio.create_task(steady(node.url, args.rate, args.seconds))
            end = time.monotonic() + 2 + args.seconds  # steady's first jobs are due 2 s out
            readers = [dry_runs(shared, end, n, answers) for n in range(clients)]
            _, (submits, ready), *_ = await asyncio.gather(load, probe(node.url, end), *readers)
        accepted = load.result()
        await drained(output, len(accepted), deadline_s=180)
    finally:
        stopped(receiver)
    got = received(output)
    late = summary([got[job] - due for job, due in accepted.items() if job in got])
    submit = summary(submits)
    return {
        "lateness_p50": late["p50"],
        "lateness_p99": late["p99"],
        "lost": len(accepted) - late["n"],
        "submit_p50": submit["p50"],
        "submit_p99": submit["p99"],
        "submit_max": submit["max"],
        "readyz_200": ready[200],
        "readyz_other": sum(ready.values()) - ready[200],
        "dry_200": answers[200],
        "dry_429": answers[429],
        "dry_other": sum(answers.values()) - answers[200] - answers[429],
    }


def shown(stats: dict[str, float]) -> str:
    return (
        f"submit p50 {stats['submit_p50'] * 1000:.1f} ms p99 {stats['submit_p99'] * 1000:.1f} ms"
        f" max {stats['submit_max'] * 1000:.1f} ms; /readyz {stats['readyz_200']:.0f} x 200,"
        f" {stats['readyz_other']:.0f} other; lateness p99 {stats['lateness_p99'] * 1000:.1f} ms;"
        f" lost {stats['lost']:.0f}; dry runs {stats['dry_200']:.0f} x 200,"
        f" {stats['dry_429']:.0f} x 429, {stats['dry_other']:.0f} other"
    )


async def main(args: argparse.Namespace) -> None:
    results: dict[str, object] = dict(vars(args))
    with services() as svc, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await apply_migrations(svc.database_url)
        await copy_backlog(svc.database_url, args.jobs)
        env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
        node = DispatcherProcess(folder, port=reserve_port(), env=env, name="reads")
        node.start()
        plain: list[dict[str, float]] = []
        dry: list[dict[str, float]] = []
        try:
            warm = argparse.Namespace(**{**vars(args), "seconds": 10})
            await one_run(node, svc, folder, warm, "warm-up")  # a fresh node's first
            for run in range(args.runs):
                plain.append(await one_run(node, svc, folder, args, f"plain-{run}"))
                print(f"    without: {shown(plain[-1])}", flush=True)
                dry.append(await one_run(node, svc, folder, args, f"dry-{run}"))
                print(f"    with:    {shown(dry[-1])}", flush=True)
        finally:
            node.stop()
    m_plain, m_dry = medians(plain), medians(dry)
    ratio = m_dry["lateness_p99"] / m_plain["lateness_p99"]
    results.update(plain=plain, dry=dry, lateness_p99_ratio=ratio)
    print(
        f"  {args.clients} clients of dry runs for {args.seconds:.0f} s over {args.jobs:,}"
        f" scheduled jobs: other submits p99 {m_plain['submit_p99'] * 1000:.1f} ->"
        f" {m_dry['submit_p99'] * 1000:.1f} ms; /readyz non-200 {m_dry['readyz_other']:.0f} of"
        f" {m_dry['readyz_200'] + m_dry['readyz_other']:.0f}; firing lateness p99"
        f" {m_plain['lateness_p99'] * 1000:.1f} -> {m_dry['lateness_p99'] * 1000:.1f} ms"
        f" ({ratio:.2f}x); dry runs answered {m_dry['dry_200']:.0f} x 200,"
        f" {m_dry['dry_429']:.0f} x 429 (medians of {args.runs})",
        flush=True,
    )
    print(f"  written to {write('bulk_reads', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--runs", type=int, default=1)
    harness.run(main(parser.parse_args()))
