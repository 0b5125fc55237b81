"""Three nodes on a three-server ZooKeeper ensemble under a steady load: kill -9 the leader, then
a follower (each restarted after), and measure from each kill to the end of the longest pause in
deliveries, the lateness of the jobs due around it, and whether any shard moved.

    .venv/bin/python -m bench.zk_ensemble [--rounds 2] [--rate 200] [--session 6]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.failover import Load, lateness, longest_pause
from bench.harness import services, summary, write
from devstack.collector import Collector
from devstack.node_cluster import Cluster
from devstack.zk_ownership import ownership
from devstack.zookeeper_ensemble import ZooKeeperEnsemble

PHASE_S = 12.0


def pause_after(collector: Collector, killed_at: float) -> tuple[float, float]:
    """(longest gap between deliveries in the phase after the kill, kill to its end)."""
    gap, end = longest_pause(collector, killed_at - 1, killed_at + PHASE_S)
    return gap, end - killed_at


async def main(rounds: int, rate: int, session_s: float) -> None:
    with (
        services() as svc,
        tempfile.TemporaryDirectory() as logs,
        tempfile.TemporaryDirectory() as zk_root,
    ):
        ensemble = ZooKeeperEnsemble(Path(zk_root))
        await asyncio.to_thread(ensemble.start)
        env = {
            "DISPATCHER_DATABASE_URL": svc.database_url,
            "DISPATCHER_AMQP_URL": svc.amqp_url,
            "DISPATCHER_ZK_HOSTS": f"{ensemble.hosts}/bench",
            "DISPATCHER_ZK_SESSION_TIMEOUT_S": str(session_s),
            "DISPATCHER_LEASE_S": "5",
        }
        cluster = Cluster(Path(logs), env, shard_count=64)
        collector = Collector(svc.amqp_url, binding="bench.#")
        await collector.start()
        kills: list[dict[str, object]] = []
        try:
            for name in ("n0", "n1", "n2"):
                await asyncio.to_thread(cluster.start, name)
            await asyncio.to_thread(cluster.wait_converged)
            before = await asyncio.to_thread(ownership, cluster)
            load = Load(cluster, rate)
            loader = asyncio.create_task(load.run(time.time() + PHASE_S * (1 + 2 * rounds)))
            await asyncio.sleep(PHASE_S)
            for role in itertools.islice(itertools.cycle(("leader", "follower")), rounds):
                leader = await asyncio.to_thread(ensemble.leader)
                victim = leader if role == "leader" else ensemble.followers()[0]
                killed_at = time.time()
                await asyncio.to_thread(victim.kill)
                await asyncio.sleep(PHASE_S)
                gap, resumed = pause_after(collector, killed_at)
                around = lateness(load, collector, killed_at - 5, killed_at + PHASE_S - 2)
                kills.append(
                    {
                        "role": role,
                        "pause_s": gap,
                        "resumed_s": resumed,
                        "lateness": summary(around),
                    }
                )
                await asyncio.to_thread(victim.start)
                await asyncio.sleep(PHASE_S)
            await loader
            missing = await collector.wait_for(load.accepted, 60)
            await collector.settle(2)
            moved = await asyncio.to_thread(ownership, cluster) != before
            extra = sum(len(d) - 1 for d in collector.deliveries.values() if len(d) > 1)
        finally:
            await collector.stop()
            cluster.stop()
            await asyncio.to_thread(ensemble.stop)
    result = {
        "session_timeout_s": session_s,
        "rate_per_s": rate,
        "kills": kills,
        "accepted": len(load.accepted),
        "lost": len(missing),
        "extra_deliveries": extra,
        "ownership_changed": moved,
    }
    print(f"ZooKeeper ensemble, one server killed (session {session_s}s, {rate} jobs/s, 3 nodes)")
    for kill in kills:
        stats = kill["lateness"]
        assert isinstance(stats, dict)
        print(
            f"  {kill['role']:8} longest pause {kill['pause_s']:.2f}s, ended"
            f" {kill['resumed_s']:.2f}s after the kill; lateness p50 {stats['p50'] * 1000:.0f} ms"
            f" p99 {stats['p99'] * 1000:.0f} ms max {stats['max'] * 1000:.0f} ms (n={stats['n']})"
        )
    print(
        f"  accepted {len(load.accepted)}, lost {len(missing)}, extra deliveries {extra},"
        f" ownership changed: {moved}"
    )
    print(f"  written to {write('zk_ensemble', result)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--session", type=float, default=6.0)
    args = parser.parse_args()
    harness.run(main(args.rounds, args.rate, args.session))
