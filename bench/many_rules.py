"""What a large rule book costs the nodes' event loops (``docs/how-to/flow-control.md``): two nodes
sharing ZooKeeper, PostgreSQL and RabbitMQ, ``--rules`` flow rules of which ``--metered`` meter a
rate (on keys with no jobs: the meter still looks for them), the rest paused.

- obeyed: ``--changes`` times a pause of another key is made through the first node, then
  resumed; each time, how long until both nodes show a job of that key held (and free again), by
  ``held_by`` in ``GET /v1/jobs/{id}``, which each node answers from its own copy of the rules;
- /healthz: its answer time on both nodes, asked every 20 ms from the first change until
  ``--steady`` seconds after the last (long enough for the meter's whole walk every 30 s).

    .venv/bin/python -m bench.many_rules [--rules 10000] [--metered 5000] [--changes 5]
        [--steady 35]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx

from bench import harness
from bench.harness import services, summary, write
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.store.migrate import apply_migrations

TOKEN = "bench-admin-token-0123456789"
PROBE = "probe"  # the key paused and resumed; no rule of the book is on it
POLL_S = 0.02
DEADLINE_S = 60.0  # a change not obeyed by then counts as this long


async def set_rules(dsn: str, count: int, metered: int) -> None:
    """``count`` rules for every namespace, each on a key of its own: the first ``metered`` a
    rate, the rest paused."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.executemany(
            "INSERT INTO flow_rules (key, paused, note, rate_per_s, burst)"
            " VALUES ($1, $2, 'bench', $3, $4)",
            [
                (
                    f"tenant{n % 97}.key{n}",
                    n >= metered,
                    100.0 if n < metered else None,
                    10 if n < metered else None,
                )
                for n in range(count)
            ],
        )
    finally:
        await connection.close()


async def healthz(
    http: httpx.AsyncClient, url: str, took: list[float], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        answer = await http.get(f"{url}/healthz")
        took.append(time.perf_counter() - started)
        answer.raise_for_status()
        await asyncio.sleep(POLL_S)


async def obeyed(http: httpx.AsyncClient, url: str, job_id: str, *, held: bool) -> float:
    """Seconds until the node at ``url`` shows the job held (or free), at most DEADLINE_S."""
    started = time.monotonic()
    while time.monotonic() - started < DEADLINE_S:
        answer = await http.get(f"{url}/v1/jobs/{job_id}")
        if (answer.json()["held_by"] is not None) is held:
            return time.monotonic() - started
        await asyncio.sleep(0.01)
    return DEADLINE_S


async def main(rules: int, metered: int, changes: int, steady_s: float) -> None:
    results: dict[str, object] = {"rules": rules, "metered": metered, "changes": changes}
    with services(zookeeper=True) as svc, tempfile.TemporaryDirectory() as tmp:
        await apply_migrations(svc.database_url)
        await set_rules(svc.database_url, rules, metered)
        env = {
            "DISPATCHER_DATABASE_URL": svc.database_url,
            "DISPATCHER_AMQP_URL": svc.amqp_url,
            "DISPATCHER_ZK_HOSTS": svc.zk_hosts,
            "DISPATCHER_API_KEYS": f"{TOKEN}:admin",
            "DISPATCHER_SHARD_COUNT": "16",
            "DISPATCHER_MAX_FLOW_RULES": str(rules + 1),  # room for the key paused and resumed
        }
        nodes = [
            DispatcherProcess(Path(tmp), port=reserve_port(), env=env, name=name, api_key=TOKEN)
            for name in ("a", "b")
        ]
        for node in nodes:
            await asyncio.to_thread(node.start, ready_timeout=120)
        took: dict[str, list[float]] = {node.name: [] for node in nodes}
        stop = asyncio.Event()
        try:
            async with httpx.AsyncClient(headers=nodes[0].auth, timeout=30) as http:
                made = await http.post(
                    f"{nodes[0].url}/v1/jobs",
                    json={"routing_key": f"{PROBE}.x", "payload": 0, "delay_ms": 3_600_000},
                )
                made.raise_for_status()
                job_id = made.json()["id"]
                pollers = [
                    asyncio.create_task(healthz(http, node.url, took[node.name], stop))
                    for node in nodes
                ]
                obey: list[float] = []
                for _ in range(changes):
                    for verb, held in (("pause", True), ("resume", False)):
                        answer = await http.post(
                            f"{nodes[0].url}/v1/limits/{PROBE}/{verb}",
                            json={} if held else None,
                        )
                        answer.raise_for_status()
                        each = await asyncio.gather(
                            *(obeyed(http, node.url, job_id, held=held) for node in nodes)
                        )
                        obey.append(max(each))
                        await asyncio.sleep(0.5)
                await asyncio.sleep(steady_s)
                stop.set()
                await asyncio.gather(*pollers)
        finally:
            stop.set()
            for node in nodes:
                node.stop()
    answers = summary([value for each in took.values() for value in each])
    results["obeyed_s"] = summary(obey)
    results["healthz_s"] = answers
    print(
        f"  {rules:,} rules ({metered:,} metered), 2 nodes: a change obeyed on every node within"
        f" {max(obey) * 1000:.0f} ms (max of {len(obey)}; median {harness.median(obey) * 1000:.0f}"
        f" ms); /healthz meanwhile p50 {answers['p50'] * 1000:.1f} ms,"
        f" p99 {answers['p99'] * 1000:.1f} ms, max {answers['max'] * 1000:.1f} ms"
        f" ({answers['n']:.0f} answers)",
        flush=True,
    )
    print(f"  written to {write('many_rules', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rules", type=int, default=10_000)
    parser.add_argument("--metered", type=int, default=5_000)
    parser.add_argument("--changes", type=int, default=5)
    parser.add_argument("--steady", type=float, default=35.0)
    args = parser.parse_args()
    print("many flow rules: how soon a change is obeyed, and what the loop answers meanwhile")
    harness.run(main(args.rules, args.metered, args.changes, args.steady))
