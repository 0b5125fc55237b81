"""Every tier replicated, one server of each killed in turn under a steady load: three dispatcher
nodes on a three-node RabbitMQ cluster, a three-server ZooKeeper ensemble and a PostgreSQL
primary with a synchronous standby, an independent consumer reading a quorum queue. In order:
kill -9 the RabbitMQ node the dispatchers publish through, the node leading the consumer's queue,
the ZooKeeper leader (each restarted after), then the PostgreSQL primary, its standby promoted.

For each kill: the time from it to the first delivery of a job due after it, the longest pause in
deliveries after it, and the lateness of the jobs due around it; at the end the ledger (lost,
early, delivered more than once) of every job the dispatchers accepted.

    .venv/bin/python -m bench.ha_failover [--rate 200] [--session 6]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import harness
from bench.failover import Load, lateness, longest_pause
from bench.harness import summary, write
from devstack.collector import Collector
from devstack.node_cluster import Cluster
from devstack.postgres_standby import PrimaryWithStandby
from devstack.rabbitmq_cluster import RabbitCluster
from devstack.zookeeper_ensemble import ZooKeeperEnsemble

PHASE_S = 15.0  # after each kill: long enough for a RabbitMQ node's restart to matter
DATABASE = "dispatcher"


def after_the_kill(collector: Collector, load: Load, killed_at: float) -> dict[str, float]:
    """Seconds from the kill to the first delivery of a job due after it, and the longest gap
    between deliveries from a second before the kill to the end of its phase (and when it ended)."""
    due_after = [
        got[0].received_at
        for job_id, (run_at, _shard) in load.accepted.items()
        if run_at >= killed_at and (got := collector.deliveries.get(job_id))
    ]
    gap, end = longest_pause(collector, killed_at - 1, killed_at + PHASE_S)
    return {
        "first_fire_s": min(due_after, default=float("nan")) - killed_at,
        "pause_s": gap,
        "pause_ended_s": end - killed_at,
    }


def start_side_by_side(*starts: Callable[[], None]) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(starts)) as pool:
        for started in [pool.submit(start) for start in starts]:
            started.result()


async def main(rate: int, session_s: float) -> None:
    databases = PrimaryWithStandby.fresh()
    with tempfile.TemporaryDirectory() as logs, tempfile.TemporaryDirectory() as state:
        brokers = RabbitCluster.local(Path(state) / "rabbitmq")
        ensemble = ZooKeeperEnsemble(Path(state) / "zookeeper")
        await asyncio.to_thread(
            start_side_by_side, lambda: databases.start(DATABASE), brokers.start, ensemble.start
        )
        env = {
            "DISPATCHER_DATABASE_URL": databases.dsn(DATABASE),
            "DISPATCHER_AMQP_URL": brokers.url(),
            "DISPATCHER_ZK_HOSTS": f"{ensemble.hosts}/bench",
            "DISPATCHER_ZK_SESSION_TIMEOUT_S": str(session_s),
            "DISPATCHER_LEASE_S": "5",
            "DISPATCHER_MIGRATE_ON_START": "true",
        }
        cluster = Cluster(Path(logs), env, shard_count=64)
        # The consumer lists the brokers the other way round: its queue is led by another node
        # than the one the dispatchers publish through, so each kill hits one of them.
        collector = Collector(",".join(reversed(brokers.urls())), binding="bench.#", quorum=True)
        kills: list[dict[str, object]] = []
        try:
            await collector.start()
            for name in ("n0", "n1", "n2"):
                await asyncio.to_thread(cluster.start, name)
            await asyncio.to_thread(cluster.wait_converged)
            load = Load(cluster, rate)
            loader = asyncio.create_task(load.run(time.time() + PHASE_S * 8))
            await asyncio.sleep(PHASE_S)

            async def kill(what: str, victim: Callable[[], None], heal: Callable[[], None]) -> None:
                killed_at = time.time()
                await asyncio.to_thread(victim)
                await asyncio.sleep(PHASE_S)
                around = lateness(load, collector, killed_at - 2, killed_at + PHASE_S - 2)
                kills.append(
                    {"what": what, **after_the_kill(collector, load, killed_at)}
                    | {"lateness": summary(around)}
                )
                await asyncio.to_thread(heal)
                await asyncio.sleep(PHASE_S / 3)

            publishing = brokers.nodes[0]  # every dispatcher connects to the first URL
            await kill(
                "RabbitMQ node the dispatchers publish through",
                lambda: brokers.kill(publishing),
                lambda: brokers.restart(publishing),
            )
            leading = await asyncio.to_thread(brokers.leader_of, collector.queue_name)
            await kill(
                f"RabbitMQ node leading the consumer's queue ({leading.nodename.split('@')[0]})",
                lambda: brokers.kill(leading),
                lambda: brokers.restart(leading),
            )
            leader = await asyncio.to_thread(ensemble.leader)
            await kill("ZooKeeper leader", leader.kill, leader.start)
            await kill("PostgreSQL primary, standby promoted", databases.fail_over, lambda: None)
            await loader
            missing = await collector.wait_for(load.accepted, 120)
            await collector.settle(2)
            ledger = collector.ledger({job: at for job, (at, _) in load.accepted.items()})
        finally:
            await collector.stop()
            cluster.stop()
            await asyncio.to_thread(ensemble.stop)
            await asyncio.to_thread(brokers.stop)
            await asyncio.to_thread(databases.stop)
    result = {
        "rate_per_s": rate,
        "session_timeout_s": session_s,
        "kills": kills,
        "accepted": len(load.accepted),
        "lost": len(missing),
        "early": len(ledger.early),
        "delivered_more_than_once": len(ledger.duplicated),
    }
    print(f"Every tier replicated, one server killed at a time ({rate} jobs/s, 3 nodes)")
    for entry in kills:
        stats = entry["lateness"]
        assert isinstance(stats, dict)
        print(
            f"  {entry['what']}: first job due after the kill fired {entry['first_fire_s']:.2f}s"
            f" after it; longest pause {entry['pause_s']:.2f}s (ended {entry['pause_ended_s']:.2f}s"
            f" after the kill); lateness p50 {stats['p50'] * 1000:.0f} ms p99"
            f" {stats['p99'] * 1000:.0f} ms max {stats['max'] * 1000:.0f} ms (n={stats['n']})"
        )
    print(f"  accepted {len(load.accepted)}; {ledger}")
    print(f"  written to {write('ha_failover', result)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--session", type=float, default=6.0)
    args = parser.parse_args()
    harness.run(main(args.rate, args.session))
