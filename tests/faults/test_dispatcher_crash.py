"""kill -9 of a dispatcher while it fires thousands of jobs due within seconds: single node and a
node of a three-node cluster. The claims cut off by the crash fire again once their lease runs
out; nothing is lost and nothing arrives before it is due."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.cluster import SESSION_S, Cluster, start_nodes
from tests.support.collector import Collector
from tests.support.process import DispatcherProcess
from tests.support.schedule import run_at_s, schedule_spread, submit_spread
from tests.support.waiting import eventually

pytestmark = pytest.mark.faults

HEAVY = 6000  # jobs due within a few seconds: firing runs flat out when the kill lands


async def test_kill_9_during_heavy_firing_loses_nothing(
    dispatcher: DispatcherProcess, collector: Collector
) -> None:
    accepted = await schedule_spread(dispatcher.url, HEAVY, over_s=3, start_in_s=2, batch=1000)
    await eventually(lambda: len(collector.deliveries) >= HEAVY // 4, 60)
    dispatcher.kill()
    delivered_before_kill = len(collector.deliveries)
    dispatcher.start()
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
    print(
        f"\nkill -9 during heavy firing after {delivered_before_kill}/{HEAVY} deliveries; {ledger}"
    )
    assert delivered_before_kill < HEAVY, "the kill landed while jobs were still firing"
    assert ledger.lost == []
    assert ledger.early == []


async def test_kill_9_of_the_leader_during_heavy_firing_fails_over_and_loses_nothing(
    cluster: Cluster, collector: Collector
) -> None:
    await start_nodes(cluster, "n0", "n1", "n2")
    jobs = await submit_spread(
        [n.url for n in cluster.live()], HEAVY, over_s=8, start_in_s=2, batch=1000
    )
    accepted = {job["id"]: run_at_s(job) for job in jobs}
    await eventually(lambda: len(collector.deliveries) >= HEAVY // 4, 60)
    victim_shards = {int(shard) for shard in cluster.view("n0")["owned"]}
    killed_at = time.time()
    cluster.nodes["n0"].kill()
    delivered_before_kill = len(collector.deliveries)
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
    # Failover: how late the victim's jobs due after the kill arrived.
    victims = [
        job["id"] for job in jobs if job["shard"] in victim_shards and run_at_s(job) >= killed_at
    ]
    late = [
        collector.deliveries[job_id][0].received_at - max(accepted[job_id], killed_at)
        for job_id in victims
        if job_id in collector.deliveries
    ]
    print(
        f"\nkill -9 of the leader after {delivered_before_kill}/{HEAVY} deliveries: worst "
        f"lateness of its jobs {max(late, default=0):.2f}s (session {SESSION_S}s); {ledger}"
    )
    assert ledger.lost == []
    assert ledger.early == []
    assert max(late, default=0) < SESSION_S + 10  # session timeout + a few seconds
    await asyncio.to_thread(cluster.wait_converged, {"n1", "n2"})
    assert cluster.view("n1")["leader"] == "n1"
