"""Lateness while a snapshot is held: one node firing a steady rate while another session keeps a
REPEATABLE READ transaction open (a report, a ``pg_dump``), so vacuum can remove no row that died
after it began. Every minute: the jobs delivered and their lateness, the dead rows of ``jobs``,
the age of the oldest snapshot, the CPU seconds of the node and of PostgreSQL, and the statements
that took PostgreSQL's time (``pg_stat_statements``); at the minutes asked, ``EXPLAIN (ANALYZE,
BUFFERS)`` of each recurring statement: the buffers it reads as dead rows pile up.

    .venv/bin/python -m bench.held_snapshot [--minutes 30] [--rate 800] [--explain-at 1 10]
        [--no-hold]   # the same load with no snapshot held, for comparison
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from bench import harness
from bench.harness import percentile, write
from bench.soak import Tally, submit_steadily
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from devstack.postgres import QUEUE_SETTINGS
from dispatcher.firing import loader
from dispatcher.store import jobs
from dispatcher.store.queries import history, scheduler

TICKS = os.sysconf("SC_CLK_TCK")
PROFILED = {**QUEUE_SETTINGS, "shared_preload_libraries": "pg_stat_statements"}
TOP = 6  # statements shown a minute


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of one process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def postgres_pids() -> list[int]:
    """Every PostgreSQL process of this machine (the benchmark's is the only one running)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@dataclass
class CpuMeter:
    """CPU seconds spent since the last reading, by the node and by PostgreSQL's processes (a
    backend that ended between readings is missed: the node's pool keeps its connections)."""

    node_pid: int
    last: dict[int, float] = field(default_factory=dict)

    def read(self) -> tuple[float, float]:
        now = {pid: cpu_s(pid) for pid in [self.node_pid, *postgres_pids()]}
        spent = {pid: now[pid] - self.last.get(pid, 0.0) for pid in now}
        self.last = now
        node = spent.pop(self.node_pid)
        return node, sum(spent.values())


async def statements(db: asyncpg.Connection) -> dict[str, tuple[float, int, int]]:
    """Each statement's total time (ms), calls and shared buffers touched, so far."""
    rows = await db.fetch(
        "SELECT query, total_exec_time, calls, shared_blks_hit + shared_blks_read AS blocks "
        "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
        "WHERE datname = current_database())"
    )
    return {row["query"]: (row["total_exec_time"], row["calls"], row["blocks"]) for row in rows}


def busiest(
    before: dict[str, tuple[float, int, int]], after: dict[str, tuple[float, int, int]]
) -> list[dict[str, Any]]:
    """The statements that took the most time between two readings."""
    spent: list[dict[str, Any]] = []
    for query, (total, calls, blocks) in after.items():
        was = before.get(query, (0.0, 0, 0))
        if calls > was[1]:
            spent.append(
                {
                    "query": " ".join(query.split())[:90],
                    "ms": round(total - was[0], 1),
                    "calls": calls - was[1],
                    "blocks_per_call": round((blocks - was[2]) / (calls - was[1]), 1),
                }
            )
    return sorted(spent, key=lambda row: -float(row["ms"]))[:TOP]


def recurring(shards: Sequence[int], epochs: Sequence[int]) -> Iterator[tuple[str, str, list[Any]]]:
    """The statements a node runs over and over that walk an index of ``jobs``, with the
    arguments a node owning every shard gives them."""
    now = datetime.now(UTC)
    no_rules = ["{}", []]  # what flow rules hold (``not_held``): nothing here
    window = [shards, now, uuid.UUID(int=0), now + timedelta(seconds=60), 1000, *no_rules]
    yield "load (window)", scheduler.LOAD_DUE, window
    # A sweep every 5 s reads the leases run out since the last one (less the look back); the
    # full look, spaced by its cost, reads them all.
    last_look = now - timedelta(seconds=5 + loader.LEASE_LOOK_BACK_S)
    yield "expired leases (since last look)", scheduler.EXPIRED_LEASES, [shards, 1000, last_look]
    yield "expired leases (full look)", scheduler.EXPIRED_LEASES, [shards, 1000, jobs.EVER]
    # As the only node, which took every shard under the epoch it holds.
    orphans = [shards, epochs, epochs, "bench", [], 5.0, 1000]
    yield "orphaned claims", scheduler.ORPHANED_CLAIMS, orphans
    yield "overdue stragglers", scheduler.OVERDUE_STRAGGLERS, [shards, 15.0, 1000, *no_rules]
    yield "count scheduled", history.COUNT_STATE, ["scheduled", 10]
    yield "count dispatching", history.COUNT_STATE, ["dispatching", 10]
    yield "next due", history.NEXT_DUE, [10]


def indexes(plan: dict[str, Any]) -> list[str]:
    """The indexes a plan reads (and any sequential scan)."""
    found = [plan["Index Name"]] if "Index Name" in plan else []
    if plan.get("Node Type") == "Seq Scan":
        found.append(f"seq {plan.get('Relation Name')}")
    for child in plan.get("Plans", []):
        found += indexes(child)
    return found


async def explain(
    db: asyncpg.Connection, statement: str, arguments: Sequence[Any]
) -> dict[str, Any]:
    plan = await db.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, *arguments)
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]
    node = top["Plan"]
    return {
        "buffers": node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0),
        "ms": round(top["Execution Time"], 2),
        "rows": node.get("Actual Rows", 0),
        "indexes": ",".join(indexes(node)),
    }


async def explained(db: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    """Each recurring statement's buffers and time, as EXPLAIN (ANALYZE, BUFFERS) reports; the
    confirm's mark as planned for its values and as a cached generic plan, rolled back."""
    epochs = await db.fetch("SELECT shard, epoch FROM shard_epochs ORDER BY shard")
    shards = [row["shard"] for row in epochs]
    found: dict[str, dict[str, Any]] = {}
    for name, statement, arguments in recurring(shards, [row["epoch"] for row in epochs]):
        found[name] = await explain(db, statement, arguments)
    marked = [
        row["id"]
        for row in await db.fetch(
            "SELECT id FROM jobs WHERE state = 'dispatched' ORDER BY updated_at DESC LIMIT 20"
        )
    ]
    for mode in ("force_custom_plan", "force_generic_plan"):
        transaction = db.transaction()
        await transaction.start()
        try:
            await db.execute(f"SET LOCAL plan_cache_mode = {mode}")
            found[f"mark ({mode.split('_')[1]})"] = await explain(
                db, scheduler.MARK_DISPATCHED, [marked]
            )
        finally:
            await transaction.rollback()  # EXPLAIN ANALYZE ran the update
    return found


async def hold(url: str, ready: asyncio.Event, done: asyncio.Event) -> None:
    """What an operator's report does: a snapshot taken and kept until ``done``."""
    db = await asyncpg.connect(url)
    try:
        async with db.transaction(isolation="repeatable_read"):
            await db.fetchval("SELECT count(*) FROM jobs")
            ready.set()
            await done.wait()
    finally:
        await db.close()


async def main(minutes: float, rate: int, explain_at: Sequence[int], held: bool) -> None:
    tally = Tally()
    rows: list[dict[str, Any]] = []
    plans: dict[str, dict[str, dict[str, Any]]] = {}
    with (
        harness.services(postgres_settings=PROFILED) as svc,
        tempfile.TemporaryDirectory() as folder,
    ):
        env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
        node = DispatcherProcess(Path(folder), port=reserve_port(), env=env)
        node.start()
        db = await asyncpg.connect(svc.database_url)
        await db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        output = Path(folder) / "received.txt"
        receiver = harness.started("bench.receiver", svc.amqp_url, "bench.soak", str(output))
        holding, done = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(hold(svc.database_url, holding, done)) if held else None
        try:
            if holder is not None:
                await holding.wait()
            started = time.time()
            duration_s = minutes * 60
            submitter = asyncio.create_task(
                submit_steadily(node.url, tally, rate, 30.0, started + duration_s + 30.0)
            )
            meter = CpuMeter(node.pid)
            meter.read()
            await db.execute("SELECT pg_stat_statements_reset()")
            before = await statements(db)
            for minute in range(1, int(minutes) + 1):
                await asyncio.sleep(max(0.0, started + 30.0 + minute * 60 - time.time()))
                late = await asyncio.to_thread(tally.read_new, output)
                node_cpu, pg_cpu = meter.read()
                after = await statements(db)
                row = {
                    "minute": minute,
                    "delivered": len(late),
                    "p50_ms": percentile(late, 0.50) * 1000,
                    "p99_ms": percentile(late, 0.99) * 1000,
                    "max_ms": max(late, default=float("nan")) * 1000,
                    "dead_rows": await db.fetchval(
                        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'"
                    ),
                    "oldest_xmin_age": await db.fetchval(
                        "SELECT max(age(backend_xmin)) FROM pg_stat_activity"
                    ),
                    "node_cpu_s": round(node_cpu, 1),
                    "postgres_cpu_s": round(pg_cpu, 1),
                    "busiest": busiest(before, after),
                }
                before = after
                rows.append(row)
                show(row)
                if minute in explain_at:
                    plans[str(minute)] = await explained(db)
                    for name, figures in plans[str(minute)].items():
                        print(
                            f"      explain {name:20} buffers {figures['buffers']:9.0f}  "
                            f"{figures['ms']:8.2f} ms  rows {figures['rows']:6.0f}  "
                            f"{figures['indexes']}",
                            flush=True,
                        )
            submitter.cancel()
            await asyncio.sleep(5)
            await asyncio.to_thread(tally.read_new, output)
        finally:
            done.set()
            if holder is not None:
                await holder
            await db.close()
            harness.stopped(receiver)
            node.stop()
    due = time.time() - 10  # jobs due since may still be on their way
    lost = sum(1 for job, at in tally.accepted.items() if at < due and job not in tally.arrivals)
    print(f"  not delivered: {lost}, duplicates: {tally.duplicates()}")
    path = write(
        "held_snapshot" if held else "held_snapshot_baseline",
        {"minutes": minutes, "rate": rate, "held": held, "rows": rows, "plans": plans},
    )
    print(f"  written to {path}")


def show(row: dict[str, Any]) -> None:
    print(
        f"  minute {row['minute']:3}  delivered {row['delivered']:6}  "
        f"p50 {row['p50_ms']:6.1f} ms  p99 {row['p99_ms']:7.1f} ms  max {row['max_ms']:7.1f} ms  "
        f"dead {row['dead_rows']:9}  xmin age {row['oldest_xmin_age'] or 0:8}  "
        f"cpu node {row['node_cpu_s']:5.1f} s  postgres {row['postgres_cpu_s']:5.1f} s",
        flush=True,
    )
    for statement in row["busiest"]:
        print(
            f"      {statement['ms']:9.1f} ms {statement['calls']:7} calls "
            f"{statement['blocks_per_call']:9.1f} buffers/call  {statement['query']}",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=int, default=800)
    parser.add_argument("--explain-at", type=int, nargs="*", default=[1, 10])
    parser.add_argument("--no-hold", action="store_true")
    args = parser.parse_args()
    print(
        f"firing {args.rate}/s for {args.minutes:.0f} min, "
        + ("no snapshot held" if args.no_hold else "a REPEATABLE READ snapshot held throughout")
    )
    harness.run(main(args.minutes, args.rate, args.explain_at, not args.no_hold))
