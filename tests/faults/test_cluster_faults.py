"""A cluster against its coordination faults: a node frozen (SIGSTOP) past its ZooKeeper session
and then resumed, and ZooKeeper itself down past the session timeout. No node fires a shard it
cannot prove it owns, so neither fault makes a job fire twice; nothing is lost."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.services.zookeeper import ZooKeeperServer
from tests.support.cluster import SESSION_S, Cluster, start_nodes
from tests.support.collector import Collector
from tests.support.schedule import schedule_spread
from tests.support.waiting import eventually

pytestmark = pytest.mark.faults


async def test_a_node_frozen_past_its_session_publishes_nothing_it_held(
    cluster: Cluster, collector: Collector
) -> None:
    await start_nodes(cluster, "n0", "n1", "n2")
    accepted = await schedule_spread([n.url for n in cluster.live()], 2400, over_s=18, batch=250)
    await eventually(lambda: len(collector.deliveries) >= 300, 60)
    frozen = cluster.nodes["n1"]
    frozen.pause()
    await asyncio.to_thread(cluster.wait_converged, {"n0", "n2"})  # the others took over
    await asyncio.sleep(1)
    frozen.resume()
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=2.0)
    print(f"\nn1 frozen past its session, then resumed: {ledger}")
    assert ledger.lost == []
    assert ledger.early == []
    assert ledger.duplicated == {}
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
