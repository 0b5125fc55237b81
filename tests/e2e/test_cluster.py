"""A cluster of dispatcher processes coordinated by a real ZooKeeper: every shard owned once, a
node joining. Each scenario counts deliveries with an independent consumer: none lost, duplicates
counted. Kills, freezes and ZooKeeper outages are in tests/faults."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest

from devstack.collector import Collector
from devstack.node_cluster import SHARDS, Cluster, start_nodes
from devstack.spread import schedule_spread
from dispatcher.cluster.assignment import moved
from tests.support.nodes import WRITE
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e


async def test_three_nodes_own_every_shard_once_and_deliver_what_any_node_accepted(
    cluster: Cluster, collector: Collector
) -> None:
    await start_nodes(cluster, "n0", "n1", "n2")
    owners = cluster.owners()
    assert all(len(names) == 1 for names in owners.values())
    assert {len([s for s, n in owners.items() if n == [name]]) for name in ("n0", "n1", "n2")} <= {
        SHARDS // 3,
        SHARDS // 3 + 1,
    }
    accepted = await schedule_spread([n.url for n in cluster.live()], 900, over_s=3, batch=250)
    ledger = await collector.reckon(accepted, deadline_s=60, quiet_s=1.0)
    print(f"\nthree nodes: {ledger}")
    assert ledger.lost == []
    assert ledger.early == []
    views = [cluster.view(name) for name in ("n0", "n1", "n2")]
    assert {view["leader"] for view in views} == {"n0"}
    assert {tuple(view["members"]) for view in views} == {("n0", "n1", "n2")}


async def test_a_joining_node_takes_only_its_share_and_nothing_fires_twice(
    cluster: Cluster, collector: Collector
) -> None:
    await start_nodes(cluster, "n0", "n1", "n2")
    before = {name: [int(s) for s in cluster.view(name)["owned"]] for name in ("n0", "n1", "n2")}
    accepted = await schedule_spread([n.url for n in cluster.live()], 2000, over_s=12, batch=250)
    await eventually(lambda: len(collector.deliveries) >= 300, 60)
    await start_nodes(cluster, "n3")
    after = {
        name: [int(s) for s in cluster.view(name)["owned"]] for name in ("n0", "n1", "n2", "n3")
    }
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
    print(f"\nn3 joined: {moved(before, after)} shards moved; {ledger}")
    assert moved(before, after) == len(after["n3"]) == SHARDS // 4
    assert ledger.duplicated == {}
    assert ledger.lost == []
    assert ledger.early == []


async def test_a_job_rescheduled_through_any_node_fires_at_its_new_time_only(
    cluster: Cluster, collector: Collector
) -> None:
    """Jobs submitted to n0 sit in n0's heap (due soon: on shards n0 owns); each is moved through
    n1 or n2, earlier or later. n0 hears of it through a due notice and fires each once, at its
    new time only."""
    await start_nodes(cluster, "n0", "n1", "n2")
    n0, n1, n2 = cluster.live()
    async with httpx.AsyncClient(timeout=30, headers=WRITE) as http:

        async def submit(delay_ms: int) -> str:
            response = await http.post(
                f"{n0.url}/v1/jobs",
                json={"routing_key": "moved.anywhere", "payload": delay_ms, "delay_ms": delay_ms},
            )
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

        earlier = [await submit(40_000) for _ in range(10)]
        later = [await submit(1_500) for _ in range(10)]
        new_run_at: dict[str, float] = {}
        for number, (job_id, delay_ms) in enumerate(
            [(job_id, 500) for job_id in earlier] + [(job_id, 5_000) for job_id in later]
        ):
            through = (n1, n2)[number % 2]
            response = await http.patch(
                f"{through.url}/v1/jobs/{job_id}", json={"delay_ms": delay_ms}
            )
            assert response.status_code == 200, response.text
            new_run_at[job_id] = datetime.fromisoformat(response.json()["run_at"]).timestamp()
    ledger = await collector.reckon(new_run_at, deadline_s=25, quiet_s=1.0)
    print(f"\nrescheduled through other nodes: {ledger}")
    assert ledger.lost == []
    assert ledger.early == []  # none fired at its old time
    assert ledger.duplicated == {}
