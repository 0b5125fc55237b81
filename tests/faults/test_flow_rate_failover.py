"""A rate on a routing key holds for a cluster of three dispatcher processes together, measured at
a consumer, and still holds after one of them is killed -9: every 10 s window within 10% of
the rate. Then the rule is deleted and the rest drain: 0 lost, 0 early, duplicates counted."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from devstack.collector import Collector
from devstack.node_cluster import Cluster
from devstack.spread import schedule_spread
from tests.support.nodes import WRITE
from tests.support.waiting import eventually, until

pytestmark = pytest.mark.faults

RATE = 200
WINDOW_S = 10.0
WINDOWS = 3  # before the kill, and as many after it: 60 s measured
WARM_S = 3.0  # from the first arrival (or the last job sent), before the first window
# Enough overdue jobs to keep the key busy for the whole measure, and more.
JOBS = int(RATE * (WARM_S + 2 * WINDOWS * WINDOW_S + 8))


def per_window(arrivals: list[float], start: float, count: int) -> list[int]:
    return [
        sum(1 for at in arrivals if start + n * WINDOW_S <= at < start + (n + 1) * WINDOW_S)
        for n in range(count)
    ]


async def test_a_rate_holds_for_three_nodes_together_and_after_one_is_killed(
    cluster: Cluster, collector: Collector
) -> None:
    names = ("n0", "n1", "n2")
    for name in names:
        await asyncio.to_thread(cluster.start, name)
    await asyncio.to_thread(cluster.wait_converged, set(names))
    urls = [cluster.nodes[name].url for name in names]
    async with httpx.AsyncClient(base_url=urls[0], timeout=30) as http:
        put = await http.put("/v1/limits/rated", json={"rate_per_s": RATE})
        assert put.status_code == 200, put.text
        burst = put.json()["burst"]
    # Every node applies the rule before the jobs come due (a node that had not read it yet
    # would fire its share unmetered into the first window).
    async with httpx.AsyncClient(timeout=10) as http:

        async def metering(url: str) -> bool:
            text = (await http.get(f"{url}/metrics")).text
            return 'dispatcher_flow_rules{limit="rate"} 1.0' in text

        async def all_metering() -> bool:
            return all([await metering(url) for url in urls])

        await until(all_metering, 30)
    # Through every node in turn: a job due now lands on a shard of the node it is sent to, so
    # each node fires a third of them.
    accepted = await schedule_spread(
        urls, JOBS, 1.0, start_in_s=0.0, routing_key="rated.work", batch=1000
    )
    submitted = time.time()
    await eventually(lambda: len(collector.deliveries) > 0, 30)
    first = min(got[0].received_at for got in collector.deliveries.values())
    # The collector shares this process with the submission: what arrives while the jobs are
    # still being sent is received late, in a burst. The windows start after both.
    start = max(first, submitted) + WARM_S
    kill_at = start + WINDOWS * WINDOW_S
    await asyncio.sleep(max(0.0, kill_at - time.time()))
    cluster.nodes["n0"].kill()
    end = kill_at + WINDOWS * WINDOW_S
    await asyncio.sleep(max(0.0, end - time.time()) + 1.0)
    arrivals = [got[0].received_at for got in collector.deliveries.values()]
    counts = per_window(arrivals, start, 2 * WINDOWS)
    async with httpx.AsyncClient(base_url=urls[1], timeout=30, headers=WRITE) as http:
        deleted = await http.delete("/v1/limits/rated")
        assert deleted.status_code == 200, deleted.text
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
    expected = RATE * WINDOW_S
    print(
        f"\n{JOBS} overdue jobs of a key metered at {RATE}/s (burst {burst}) on three nodes: "
        f"arrivals per {WINDOW_S:.0f} s window {counts[:WINDOWS]}, n0 killed -9, then "
        f"{counts[WINDOWS:]} (expected {expected:.0f} each, within 10%); {ledger}"
    )
    assert ledger.lost == []
    assert ledger.early == []
    for count in counts:
        assert abs(count - expected) <= expected * 0.1, counts
