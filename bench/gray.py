"""Gray failures with the default settings: one node of three cut from one service (ZooKeeper,
PostgreSQL, RabbitMQ in turn) by a firewall rule on its own packets for 25 s, while 4 500 jobs
fall due over 55 s on every node. For each: when its shards went to the others, how late the
jobs of its shards due during the cut were, duplicates, what its /readyz said, and when it took
shards back. Needs root and iptables (``make test`` installs it).

    .venv/bin/python -m bench.gray [--cut 25] [--jobs 4500] [--over 55]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import services, summary, write
from devstack import firewall
from devstack.collector import Collector
from devstack.node_cluster import Cluster
from devstack.spread import run_at_s, submit_spread


def readyz(url: str) -> tuple[int, str]:
    try:
        response = httpx.get(f"{url}/readyz", timeout=10)
    except httpx.HTTPError:
        return 0, "no answer"
    return response.status_code, str(response.json().get("standing", {}).get("standing"))


def assigned(cluster: Cluster, name: str, asked: str) -> list[str]:
    try:
        return list(cluster.view(asked, timeout=10)["assignment"].get(name, {}))
    except httpx.HTTPError:
        return ["?"]


async def one_cut(
    service: str, url: str, env: dict[str, str], cut_s: float, count: int, over_s: float
) -> dict[str, Any]:
    logs = tempfile.mkdtemp(prefix=f"bench-gray-{service}-")  # kept: the nodes' logs
    with firewall.firewall() as wall:
        cluster = Cluster(Path(logs), env, shard_count=64)
        collector = Collector(env["DISPATCHER_AMQP_URL"], binding="bench.#")
        await collector.start()
        try:
            await asyncio.to_thread(cluster.start, "cut", None, group=wall.gid)
            for name in ("n1", "n2"):
                await asyncio.to_thread(cluster.start, name)
            await asyncio.to_thread(cluster.wait_converged, {"cut", "n1", "n2"})
            shards = {int(shard) for shard in assigned(cluster, "cut", "n1")}
            jobs = await submit_spread(
                [node.url for node in cluster.live()],
                count,
                over_s,
                start_in_s=2,
                routing_key="bench.gray",
                batch=25,
            )
            await asyncio.sleep(10)
            cut_at = time.time()
            wall.cut(firewall.port_of(url))
            said: list[tuple[float, int, str]] = []
            stop_watching = asyncio.Event()

            async def watch_readyz() -> None:  # on its own: an answer may take seconds
                while not stop_watching.is_set():
                    status, standing = await asyncio.to_thread(readyz, cluster.nodes["cut"].url)
                    if not said or said[-1][1:] != (status, standing):
                        said.append((round(time.time() - cut_at, 1), status, standing))
                    await asyncio.sleep(0.25)

            watcher = asyncio.create_task(watch_readyz())
            gone_at = None
            while time.time() < cut_at + cut_s:
                if gone_at is None and not await asyncio.to_thread(assigned, cluster, "cut", "n1"):
                    gone_at = round(time.time() - cut_at, 2)
                await asyncio.sleep(0.1)
            wall.heal(firewall.port_of(url))
            healed_at = time.time()
            back_s = None
            while time.time() < healed_at + 120:
                if await asyncio.to_thread(assigned, cluster, "cut", "n1"):
                    back_s = round(time.time() - healed_at, 2)
                    break
                await asyncio.sleep(0.1)
            stop_watching.set()
            await watcher
            due = {job["id"]: run_at_s(job) for job in jobs}
            missing = await collector.wait_for(due, 120)
            await collector.settle(2)
            cut_jobs = [
                job["id"]
                for job in jobs
                if job["shard"] in shards and cut_at <= run_at_s(job) <= healed_at
            ]
            return {
                "service": service,
                "shards_gone_after_s": gone_at,
                "lateness_of_its_jobs_due_during_the_cut_s": summary(
                    collector.lateness(due, cut_jobs)
                ),
                "lateness_all_s": summary(collector.lateness(due)),
                "its_readyz_as_it_changed": said,
                "shards_back_after_heal_s": back_s,
                "accepted": len(due),
                "logs": logs,
                "lost": len(missing),
                "extra_deliveries": sum(
                    len(got) - 1 for got in collector.deliveries.values() if len(got) > 1
                ),
            }
        finally:
            await collector.stop()
            cluster.stop()


async def main(cut_s: float, count: int, over_s: float, cut_from: list[str]) -> None:
    results = []
    with services(zookeeper=True) as svc:
        for number, service in enumerate(cut_from):
            env = {
                "DISPATCHER_DATABASE_URL": svc.database_url,
                "DISPATCHER_AMQP_URL": svc.amqp_url,
                "DISPATCHER_ZK_HOSTS": svc.zk_hosts,
                "DISPATCHER_ZK_PATH": f"/bench-gray-{number}",  # a cluster of its own each time
            }
            url = {"zookeeper": svc.zk_hosts, "postgres": svc.database_url}.get(
                service, svc.amqp_url
            )
            result = await one_cut(service, url, env, cut_s, count, over_s)
            results.append(result)
            late = result["lateness_of_its_jobs_due_during_the_cut_s"]
            print(
                f"{service:9} cut {cut_s:g} s: shards went after {result['shards_gone_after_s']} s,"
                f" back {result['shards_back_after_heal_s']} s after healing; its jobs due during"
                f" the cut p50 {late['p50']:.2f} s p99 {late['p99']:.2f} s max {late['max']:.2f} s"
                f" (n={late['n']}); lost {result['lost']}, extra deliveries"
                f" {result['extra_deliveries']}; its /readyz: {result['its_readyz_as_it_changed']}"
                f" (logs in {result['logs']})",
                flush=True,
            )
    print(f"  written to {write('gray', {'cut_s': cut_s, 'runs': results})}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cut", type=float, default=25.0)
    parser.add_argument("--jobs", type=int, default=4500)
    parser.add_argument("--over", type=float, default=55.0)
    parser.add_argument(
        "--services", nargs="+", default=["zookeeper", "postgres", "rabbitmq"], dest="cut_from"
    )
    args = parser.parse_args()
    asyncio.run(main(args.cut, args.jobs, args.over, args.cut_from))
