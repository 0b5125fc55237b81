"""kill -9 of a dispatcher while it fires thousands of jobs due within seconds: single node and a
node of a three-node cluster. The claims cut off by the crash belong to an epoch the restarted
node (or the shard's new owner) has bumped: they fire again as soon as it holds the shard, not
when their lease runs out. Every job due before the kill fires (RabbitMQ confirmed it) within the
failover time (the restart, or ZooKeeper moving the shards) plus a second; nothing is lost and
nothing arrives before it is due."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import DispatcherProcess
from devstack.node_cluster import SESSION_S, Cluster
from devstack.spread import run_at_s, schedule_spread, submit_spread
from tests.support.process import served
from tests.support.waiting import eventually

pytestmark = pytest.mark.faults

HEAVY = 6000  # jobs due within a few seconds: firing runs flat out when the kill lands
# The default lease: a claim cut off by the crash that waited for it would be 30 s late.
LEASE = {"DISPATCHER_LEASE_S": "30"}


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    """A single node with the default lease (the suite's usual one is short)."""
    yield from served(
        tmp_path, database_url, amqp_url, env={**LEASE, "DISPATCHER_SHARD_COUNT": "32"}
    )


AFTER_FAILOVER_S = 1.0  # every job due before the kill fires this soon after the failover


def due_before(accepted: dict[str, float], killed_at: float, arrived: set[str]) -> set[str]:
    """The jobs due before the kill that had not arrived when it landed (claimed, in flight, or
    waiting in memory)."""
    return {job_id for job_id, due in accepted.items() if due < killed_at} - arrived


async def claims_at_kill(database_url: str, node_id: str) -> set[str]:
    """The jobs NODE_ID had claimed and not seen confirmed when it died (read before any other
    node may take them: the takeover waits for its ZooKeeper session to expire)."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT id::text FROM jobs WHERE state = 'dispatching' AND claimed_by = $1", node_id
        )
    finally:
        await connection.close()
    return {row[0] for row in rows}


def first_arrivals(collector: Collector, ids: set[str]) -> float:
    return max((collector.deliveries[job_id][0].received_at for job_id in ids), default=0.0)


async def last_fired(database_url: str, ids: set[str]) -> float:
    """When the last of these jobs was confirmed by RabbitMQ, as the database marked it (the
    collector's arrivals come later on a loaded machine: its one consumer drains the thousands
    of overdue jobs the catch-up publishes at once, in the order they were published)."""
    connection = await asyncpg.connect(database_url)
    try:
        fired = await connection.fetchval(
            "SELECT extract(epoch FROM max(dispatched_at))::float8 FROM jobs"
            " WHERE id = ANY($1::uuid[])",
            list(ids),
        )
    finally:
        await connection.close()
    return float(fired or 0.0)


async def test_kill_9_during_heavy_firing_loses_nothing(
    dispatcher: DispatcherProcess, collector: Collector, database_url: str
) -> None:
    accepted = await schedule_spread(dispatcher.url, HEAVY, over_s=3, start_in_s=2, batch=1000)
    await eventually(lambda: len(collector.deliveries) >= HEAVY // 4, 60)
    killed_at = time.time()
    dispatcher.kill()
    arrived = set(collector.deliveries)
    await asyncio.to_thread(dispatcher.start)
    ready_at = time.time()
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
    waiting = due_before(accepted, killed_at, arrived)
    fired = await last_fired(database_url, waiting)
    print(
        f"\nkill -9 during heavy firing after {len(arrived)}/{HEAVY} deliveries; restarted and "
        f"ready in {ready_at - killed_at:.2f}s; the {len(waiting)} jobs due before the kill and "
        f"not yet arrived all fired {fired - ready_at:.2f}s after that and arrived "
        f"{first_arrivals(collector, waiting) - ready_at:.2f}s after it ({refired(dispatcher)} "
        f"claims of the killed process re-fired at the restart); {ledger}"
    )
    assert len(arrived) < HEAVY, "the kill landed while jobs were still firing"
    assert waiting
    assert ledger.lost == []
    assert ledger.early == []
    assert fired <= ready_at + AFTER_FAILOVER_S


async def test_kill_9_of_the_leader_during_heavy_firing_fails_over_and_loses_nothing(
    cluster: Cluster, collector: Collector, database_url: str
) -> None:
    for name in ("n0", "n1", "n2"):
        await asyncio.to_thread(cluster.start, name, LEASE)
    await asyncio.to_thread(cluster.wait_converged, {"n0", "n1", "n2"})
    # Through the node to be killed: a job due soon lands on a shard of the node it is submitted
    # to, so the victim is the one firing (claims in flight) when the kill lands.
    jobs = await submit_spread(cluster.nodes["n0"].url, HEAVY, over_s=8, start_in_s=2, batch=1000)
    accepted = {job["id"]: run_at_s(job) for job in jobs}
    await eventually(lambda: len(collector.deliveries) >= HEAVY // 4, 60)
    victim_shards = {int(shard) for shard in cluster.view("n0")["owned"]}
    killed_at = time.time()
    cluster.nodes["n0"].kill()
    arrived = set(collector.deliveries)
    delivered_before_kill = len(arrived)
    orphans = await claims_at_kill(database_url, "n0")
    taken_over_at = await asyncio.to_thread(converged_at, cluster, {"n1", "n2"})
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
    waiting = due_before(accepted, killed_at, arrived)
    fired = await last_fired(database_url, waiting)
    orphans_fired = await last_fired(database_url, orphans)
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
        f"\nkill -9 of the leader after {delivered_before_kill}/{HEAVY} deliveries: its shards "
        f"taken over {taken_over_at - killed_at:.2f}s after (session {SESSION_S}s); the "
        f"{len(waiting)} jobs due before the kill and not yet arrived all fired "
        f"{fired - taken_over_at:.2f}s after that (arrived "
        f"{first_arrivals(collector, waiting) - taken_over_at:.2f}s after), the {len(orphans)} "
        f"it had claimed {orphans_fired - taken_over_at:.2f}s after (arrived "
        f"{first_arrivals(collector, orphans) - taken_over_at:.2f}s after; "
        f"{refired(*cluster.live())} re-fired on takeover); worst lateness of its jobs due "
        f"after the kill {max(late, default=0):.2f}s; {ledger}"
    )
    assert orphans
    assert refired(*cluster.live()) > 0
    assert ledger.lost == []
    assert ledger.early == []
    # Its claims in flight fire once their shards are held, not a lease (30 s) later; what it
    # had only in memory is loaded and fired by the catch-up.
    assert orphans_fired <= taken_over_at + AFTER_FAILOVER_S
    assert fired <= taken_over_at + AFTER_FAILOVER_S
    assert max(late, default=0) < SESSION_S + 10  # session timeout + a few seconds
    assert cluster.view("n1")["leader"] == "n1"


def refired(*nodes: DispatcherProcess) -> int:
    """How many claims of a dead owner these nodes re-fired on taking its shards (their logs)."""
    found = re.compile(r"re-firing (\d+) jobs claimed by a previous owner")
    return sum(
        int(match.group(1)) for node in nodes for match in found.finditer(node.logs(tail=1_000_000))
    )


def converged_at(cluster: Cluster, members: set[str]) -> float:
    """When every shard was owned by one of MEMBERS (polled: a little after it happened)."""
    cluster.wait_converged(members)
    return time.time()
