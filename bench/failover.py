"""Failover on a three-node cluster: time from kill -9 until the victim's shards fire again
(median of several kills), and firing lateness while a node joins and while one dies, the claims
the victim had in flight at the kill among them (the default 30 s lease: they fire again once
their shard's new owner holds it, not when the lease runs out).

    .venv/bin/python -m bench.failover [--kills 3] [--rate 200] [--session 5]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench import harness
from bench.harness import median, services, summary, write
from devstack.collector import Collector
from devstack.node_cluster import Cluster


@dataclass
class Load:
    """Jobs due at a steady rate, submitted a little ahead, spread over the live nodes."""

    cluster: Cluster
    rate: int
    accepted: dict[str, tuple[float, int]] = field(default_factory=dict)

    async def run(self, until: float) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            slot = time.time() + 2.0
            turn = 0
            while slot < until:
                jobs = [
                    {
                        "routing_key": "bench.failover",
                        "payload": i,
                        "run_at": datetime.fromtimestamp(slot + i / self.rate, UTC).isoformat(),
                    }
                    for i in range(self.rate)
                ]
                nodes = self.cluster.live()
                node = nodes[turn % len(nodes)]
                turn += 1
                try:
                    response = await http.post(f"{node.url}/v1/jobs/batch", json={"jobs": jobs})
                except httpx.HTTPError:
                    continue  # that node just died; the next turn uses another
                if response.status_code == 201:
                    for job in response.json()["jobs"]:
                        run_at = datetime.fromisoformat(job["run_at"]).timestamp()
                        self.accepted[job["id"]] = (run_at, job["shard"])
                    slot += 1.0
                else:  # refused (503 while the database fails over): that second is skipped
                    await asyncio.sleep(0.2)
                    slot = max(slot, time.time() + 1.0)
                    continue
                await asyncio.sleep(max(0.0, slot - 1.5 - time.time()))


async def probe(url: str, first_s: float) -> dict[str, tuple[float, int]]:
    """Jobs on the victim's own shards, due every 100 ms for 15 s from ``first_s``."""
    jobs = [
        {
            "routing_key": "bench.failover",
            "payload": i,
            "run_at": datetime.fromtimestamp(first_s + i / 10, UTC).isoformat(),
        }
        for i in range(150)
    ]
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{url}/v1/jobs/batch", json={"jobs": jobs})
    response.raise_for_status()
    return {
        job["id"]: (datetime.fromisoformat(job["run_at"]).timestamp(), job["shard"])
        for job in response.json()["jobs"]
    }


def longest_pause(collector: Collector, start: float, end: float) -> tuple[float, float]:
    """The longest gap between deliveries received from START to END, and when it ended."""
    times = sorted(
        d.received_at
        for got in collector.deliveries.values()
        for d in got
        if start <= d.received_at <= end
    )
    return max(((b - a, b) for a, b in itertools.pairwise(times)), default=(0.0, start))


def lateness(
    load: Load, collector: Collector, start: float, end: float, shards: set[int] | None = None
) -> list[float]:
    values = []
    for job_id, (run_at, shard) in load.accepted.items():
        if start <= run_at < end and (shards is None or shard in shards):
            got = collector.deliveries.get(job_id)
            if got:
                values.append(got[0].received_at - run_at)
    return values


async def main(kills: int, rate: int, session_s: float) -> None:
    with services(zookeeper=True) as svc, tempfile.TemporaryDirectory() as logs:
        env = {
            "DISPATCHER_DATABASE_URL": svc.database_url,
            "DISPATCHER_AMQP_URL": svc.amqp_url,
            "DISPATCHER_ZK_HOSTS": svc.zk_hosts,
            "DISPATCHER_ZK_SESSION_TIMEOUT_S": str(session_s),
        }
        cluster = Cluster(Path(logs), env, shard_count=64)
        collector = Collector(svc.amqp_url, binding="bench.#")
        await collector.start()
        try:
            for name in ("n0", "n1", "n2"):
                await asyncio.to_thread(cluster.start, name)
            await asyncio.to_thread(cluster.wait_converged)
            phase_s = 12.0
            total_s = phase_s * (2 + 2 * kills) + 10
            load = Load(cluster, rate)
            loader = asyncio.create_task(load.run(time.time() + total_s))
            await asyncio.sleep(phase_s)
            steady = (time.time() - phase_s + 3, time.time())
            join_at = time.time()
            await asyncio.to_thread(cluster.start, "n3")
            await asyncio.sleep(phase_s)
            joining = (join_at, time.time())
            failovers: list[float] = []
            victim_lateness: list[float] = []
            in_flight: list[float] = []  # the victim's jobs due before the kill, not yet arrived
            for round_number in range(kills):
                victim = ("n1", "n2", "n3")[round_number % 3]
                shards = {int(s) for s in cluster.view(victim)["owned"]}
                probes = await probe(cluster.nodes[victim].url, time.time() + 1.0)
                load.accepted.update(probes)
                await asyncio.sleep(0.5)
                killed_at = time.time()
                cluster.nodes[victim].kill()
                arrived = set(collector.deliveries)
                await asyncio.sleep(phase_s)
                # Failover: from the kill until the first of the victim's jobs due after it fires.
                fired = [
                    collector.deliveries[job_id][0].received_at - killed_at
                    for job_id in probes
                    if job_id in collector.deliveries
                ]
                failovers.append(min(fired) if fired else float("nan"))
                victim_lateness += lateness(load, collector, killed_at, killed_at + phase_s, shards)
                in_flight += [
                    collector.deliveries[job_id][0].received_at - run_at
                    for job_id, (run_at, shard) in load.accepted.items()
                    if run_at < killed_at and shard in shards and job_id not in arrived
                    if job_id in collector.deliveries
                ]
                await asyncio.to_thread(cluster.start, victim)
                await asyncio.sleep(phase_s)
            await loader
            missing = await collector.wait_for(load.accepted, 60)
            await collector.settle(2)
            extra = sum(len(d) - 1 for d in collector.deliveries.values() if len(d) > 1)
            result = {
                "session_timeout_s": session_s,
                "rate_per_s": rate,
                "failover_s": failovers,
                "failover_median_s": median(failovers),
                "lateness_steady_s": summary(lateness(load, collector, *steady)),
                "lateness_while_joining_s": summary(lateness(load, collector, *joining)),
                "lateness_of_victims_jobs_s": summary(victim_lateness),
                "lateness_in_flight_at_kill_s": summary(in_flight),
                "accepted": len(load.accepted),
                "lost": len(missing),
                "extra_deliveries": extra,
            }
        finally:
            await collector.stop()
            cluster.stop()
    print(f"failover after kill -9 (session timeout {session_s}s, {rate} jobs/s, 3 -> 4 nodes)")
    print(f"  kills: {', '.join(f'{v:.2f}s' for v in failovers)}; median {median(failovers):.2f}s")
    for key in (
        "lateness_steady_s",
        "lateness_while_joining_s",
        "lateness_of_victims_jobs_s",
        "lateness_in_flight_at_kill_s",
    ):
        stats = result[key]
        assert isinstance(stats, dict)
        print(
            f"  {key:28} p50 {stats['p50'] * 1000:7.0f} ms  p99 {stats['p99'] * 1000:7.0f} ms"
            f"  max {stats['max'] * 1000:7.0f} ms  (n={stats['n']})"
        )
    print(f"  accepted {len(load.accepted)}, lost {len(missing)}, extra deliveries {extra}")
    print(f"  written to {write('failover', result)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--session", type=float, default=5.0)
    args = parser.parse_args()
    harness.run(main(args.kills, args.rate, args.session))
