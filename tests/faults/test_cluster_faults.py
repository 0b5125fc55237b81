"""A cluster against its coordination faults: a node frozen (SIGSTOP) past its ZooKeeper session
and then resumed, and ZooKeeper itself down past the session timeout. No node fires a shard it
cannot prove it owns, so neither fault makes a job fire twice; nothing is lost."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from devstack.collector import Collector
from devstack.node_cluster import SESSION_S, Cluster, start_nodes
from devstack.spread import schedule_spread
from devstack.zookeeper import ZooKeeperServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.faults

# Jobs a node had claimed and not yet marked dispatched. $1 node id.
IN_FLIGHT = "SELECT id FROM jobs WHERE state = 'dispatching' AND claimed_by = $1"


async def test_a_node_frozen_past_its_session_publishes_nothing_it_held(
    cluster: Cluster, collector: Collector, database_url: str
) -> None:
    await start_nodes(cluster, "n0", "n1", "n2")
    accepted = await schedule_spread([n.url for n in cluster.live()], 2400, over_s=18, batch=250)
    await eventually(lambda: len(collector.deliveries) >= 300, 60)
    frozen = cluster.nodes["n1"]
    frozen.pause()
    # Claims n1 holds at the freeze: their publishes may have reached RabbitMQ without n1 having
    # marked them, so the new owner must fire them again when their lease runs out
    # (at-least-once). Nothing else of n1's may arrive twice.
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(IN_FLIGHT, "n1")
    finally:
        await connection.close()
    in_flight = {str(row["id"]) for row in rows}
    await asyncio.to_thread(cluster.wait_converged, {"n0", "n2"})  # the others took over
    await asyncio.sleep(1)
    frozen.resume()
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=2.0)
    print(f"\nn1 frozen past its session with {len(in_flight)} claims in flight: {ledger}")
    assert ledger.lost == []
    assert ledger.early == []
    assert set(ledger.duplicated) <= in_flight
    await asyncio.to_thread(cluster.wait_converged, {"n0", "n1", "n2"})


async def test_zookeeper_down_past_the_session_pauses_firing_then_resumes_without_duplicates(
    cluster: Cluster, collector: Collector, zk_server: ZooKeeperServer
) -> None:
    await start_nodes(cluster, "n0", "n1")
    accepted = await schedule_spread([n.url for n in cluster.live()], 1500, over_s=16, batch=250)
    await eventually(lambda: len(collector.deliveries) >= 200, 60)
    await asyncio.to_thread(zk_server.stop)
    stopped_at = time.time()
    try:
        await asyncio.sleep(SESSION_S + 3)
        silent_from = stopped_at + SESSION_S  # self-fencing must have stopped everyone by now
        restarted_at = time.time()
        fired_blind = [
            job_id
            for job_id, got in collector.deliveries.items()
            if silent_from + 0.5 <= got[0].received_at <= restarted_at
        ]
    finally:
        await asyncio.to_thread(zk_server.start)
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=2.0)
    print(f"\nZooKeeper down {SESSION_S + 3:.0f}s: fired while fenced={len(fired_blind)}; {ledger}")
    assert fired_blind == []
    assert ledger.lost == []
    assert ledger.early == []
    assert ledger.duplicated == {}
