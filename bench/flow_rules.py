"""What flow rules cost the jobs they do not hold (``docs/how-to/flow-control.md``):

- throughput: ``--jobs`` due at one instant, fired into a queue (as ``bench.throughput``'s fire),
  with no rule, then with ``--rules`` paused rules (half of them under the fired key's first word,
  so that every fired job is weighed against them in SQL), then with as many rules of which
  ``--metered`` meter a rate (on keys with no jobs: what their meter's looks cost), in turn,
  ``--runs`` times each;
- lateness: a steady ``--rate`` of jobs for ``--seconds``, with no rule, then while five keys are
  paused with ``--held`` jobs due between them (half overdue, half falling due meanwhile); and
  the node's RSS in each (the held jobs are not in memory).

    .venv/bin/python -m bench.flow_rules [--jobs 50000] [--rules 1000] [--metered 100]
        [--rate 1000] [--seconds 60] [--held 1000000] [--runs 2] [--throughput-only]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from bench import harness
from bench.backlog import copy_jobs, rss_mb
from bench.harness import Services, medians, services, started, stopped, summary, write
from bench.lateness import drained, received, steady
from bench.throughput import fire
from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.store.migrate import apply_migrations

HELD_KEYS = [f"bench.held{n}" for n in range(5)]


async def set_rules(dsn: str, keys: list[str], metered: int = 0) -> None:
    """Exactly these rules (for every namespace): the first ``metered`` a rate, the rest paused."""
    connection = await asyncpg.connect(dsn)
    try:
        async with connection.transaction():
            await connection.execute("DELETE FROM flow_rules")
            await connection.executemany(
                "INSERT INTO flow_rules (key, paused, note, rate_per_s, burst)"
                " VALUES ($1, $2, 'bench', $3, $4)",
                [
                    (
                        key,
                        n >= metered,
                        1000.0 if n < metered else None,
                        100 if n < metered else None,
                    )
                    for n, key in enumerate(keys)
                ],
            )
    finally:
        await connection.close()
    await asyncio.sleep(1.5)  # every node applies a change within a second


def many_rules(count: int) -> list[str]:
    return [f"bench.other{n}" for n in range(count // 2)] + [
        f"tenant{n}.jobs" for n in range(count - count // 2)
    ]


async def throughput(
    node: DispatcherProcess, svc: Services, jobs: int, rules: int, metered: int, runs: int
) -> dict[str, object]:
    each: dict[str, list[float]] = {"none": [], "rules": [], "metered": []}
    variants = (("none", [], 0), ("rules", many_rules(rules), 0))
    variants += (("metered", many_rules(rules), metered),)
    for _ in range(runs):
        for name, keys, meters in variants:
            await set_rules(svc.database_url, keys, meters)
            rate, _ = await fire(node.url, svc.amqp_url, jobs)
            each[name].append(rate)
            print(f"    {name:7}: {rate:,.0f} jobs/s", flush=True)
    none = harness.median(each["none"])
    with_rules, with_metered = harness.median(each["rules"]), harness.median(each["metered"])
    return {
        "none": none,
        "rules": with_rules,
        "ratio": with_rules / none,
        "metered": with_metered,
        "metered_ratio": with_metered / none,
        "runs": each,
    }


async def lateness_run(
    node: DispatcherProcess, svc: Services, folder: Path, rate: int, seconds: float, name: str
) -> dict[str, float]:
    output = folder / f"received-{name}.txt"
    receiver = started("bench.receiver", svc.amqp_url, "bench.steady", str(output))
    rss: list[float] = []

    async def sample() -> None:
        while True:
            rss.append(rss_mb(node.pid))
            await asyncio.sleep(5)

    sampler = asyncio.create_task(sample())
    try:
        accepted = await steady(node.url, rate, seconds)
        await drained(output, len(accepted), deadline_s=180)
    finally:
        sampler.cancel()
        stopped(receiver)
    got = received(output)
    stats = summary([got[job] - due for job, due in accepted.items() if job in got])
    stats["lost"] = len(accepted) - int(stats["n"])
    stats["rss_max_mb"] = max(rss)
    return stats


async def main(
    jobs: int,
    rules: int,
    metered: int,
    rate: int,
    seconds: float,
    held: int,
    runs: int,
    *,
    throughput_only: bool = False,
) -> None:
    results: dict[str, object] = {
        "jobs": jobs,
        "rules": rules,
        "metered": metered,
        "rate": rate,
        "seconds": seconds,
        "held": held,
        "runs": runs,
    }
    with services() as svc, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        await apply_migrations(svc.database_url)
        env = {"DISPATCHER_DATABASE_URL": svc.database_url, "DISPATCHER_AMQP_URL": svc.amqp_url}
        node = DispatcherProcess(folder, port=reserve_port(), env=env, name="flow")
        node.start()
        try:
            print(
                f"  firing {jobs} jobs due at once, no rule against {rules} paused rules and"
                f" against {rules} rules of which {metered} metered:"
            )
            fired = await throughput(node, svc, jobs, rules, metered, runs)
            results["throughput"] = fired
            print(
                f"  throughput with {rules} rules: {fired['rules']:,.0f} jobs/s against"
                f" {fired['none']:,.0f} with none: {fired['ratio']:.1%}; with {metered} of them"
                f" metered: {fired['metered']:,.0f} jobs/s, {fired['metered_ratio']:.1%}"
                f" (medians of {runs})",
                flush=True,
            )
            if throughput_only:
                print(f"  written to {write('flow_rules_throughput', results)}")
                return
            await set_rules(svc.database_url, [])
            plain = [
                await lateness_run(node, svc, folder, rate, seconds, f"plain-{run}")
                for run in range(runs)
            ]
            await set_rules(svc.database_url, HELD_KEYS)
            now = datetime.now(UTC)
            for key in HELD_KEYS:  # half overdue, half falling due during the runs
                span = timedelta(seconds=(seconds + 10) * runs * 2)
                await copy_jobs(svc.database_url, held // len(HELD_KEYS), now - span / 2, span, key)
            paused = [
                await lateness_run(node, svc, folder, rate, seconds, f"paused-{run}")
                for run in range(runs)
            ]
        finally:
            node.stop()
        m_plain, m_paused = medians(plain), medians(paused)
        results["lateness"] = {
            "plain": {"median": m_plain, "runs": plain},
            "paused": {"median": m_paused, "runs": paused},
            "p99_ratio": m_paused["p99"] / m_plain["p99"],
        }
        print(
            f"  {rate}/s for {seconds:.0f}s, no pause: p50 {m_plain['p50'] * 1000:.1f} ms"
            f" p99 {m_plain['p99'] * 1000:.1f} ms, RSS {m_plain['rss_max_mb']:.0f} MB; five keys"
            f" paused with {held:,} jobs due between them: p50 {m_paused['p50'] * 1000:.1f} ms"
            f" p99 {m_paused['p99'] * 1000:.1f} ms ({m_paused['p99'] / m_plain['p99']:.2f}x),"
            f" RSS {m_paused['rss_max_mb']:.0f} MB (medians of {runs}; not received"
            f" {sum(r['lost'] for r in plain + paused):.0f})",
            flush=True,
        )
    print(f"  written to {write('flow_rules', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--metered", type=int, default=100)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--held", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--throughput-only", action="store_true")
    args = parser.parse_args()
    print("flow rules: what they cost the jobs they do not hold")
    harness.run(
        main(
            args.jobs,
            args.rules,
            args.metered,
            args.rate,
            args.seconds,
            args.held,
            args.runs,
            throughput_only=args.throughput_only,
        )
    )
