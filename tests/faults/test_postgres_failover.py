"""The PostgreSQL primary killed (kill -9) and its synchronous standby promoted, as a failover
manager would, while producers submit and the dispatcher fires: every job answered 2xx before or
after the kill is delivered, POSTs during the switch answer 503, and the nodes, given both hosts
in one URL, reconnect to the promoted server by themselves (their pools and LISTEN connections)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from devstack.collector import Collector, Ledger
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from devstack.node_cluster import SESSION_S, Cluster, start_nodes
from devstack.ports import reserve_port
from devstack.postgres_standby import PrimaryWithStandby
from devstack.spread import schedule_spread
from tests.support.producers import Submissions, submit_steadily
from tests.support.recovery import assert_serving_again
from tests.support.waiting import eventually, until

pytestmark = pytest.mark.faults

DB_TIMEOUT_S = 2.0
DETECTION_S = 3.0  # a failover manager's time to notice the primary is gone
# The nodes' LISTEN connections for due notices (by application_name) on the server queried.
LISTENERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'dispatcher-%-notices'"
)


@dataclass
class Outcome:
    seen: list[Submissions]
    refused_during_switch: int
    ledger: Ledger


async def fail_over_while_busy(
    pg_pair: PrimaryWithStandby, urls: list[str], collector: Collector
) -> Outcome:
    """Jobs due over 15 s and producers on every node; kill the primary once firing is under
    way, promote the standby DETECTION_S later, go on until 50 more POSTs are accepted; the
    ledger of every job answered 2xx."""
    firing = await schedule_spread(urls, 2000, over_s=15, batch=1000)
    seen = [Submissions() for _ in urls]
    stop = asyncio.Event()
    producers = [
        asyncio.create_task(submit_steadily(url, tally, stop, workers=4))
        for url, tally in zip(urls, seen, strict=True)
    ]

    def accepted() -> int:
        return sum(len(tally.accepted) for tally in seen)

    await eventually(lambda: len(collector.deliveries) >= 400, 40)
    accepted_before_kill = accepted()
    killed_at = time.time()
    await asyncio.to_thread(pg_pair.kill_primary)
    await asyncio.sleep(DETECTION_S)
    await asyncio.to_thread(pg_pair.promote)
    promoted_at = time.time()
    refused_during_switch = sum(len(tally.refused) for tally in seen)
    accepted_after_promote = accepted()
    await eventually(lambda: accepted() >= accepted_after_promote + 50, 60)
    stop.set()
    await asyncio.gather(*producers)
    everything = dict(firing)
    for tally in seen:
        everything.update(tally.accepted)
    ledger = await collector.reckon(everything, deadline_s=120, quiet_s=1.5)
    firsts = [min(d.received_at for d in got) for got in collector.deliveries.values()]
    resumed_at = min((at for at in firsts if at > promoted_at), default=float("nan"))
    refused = [status for tally in seen for status, _ in tally.refused]
    print(
        f"\nprimary killed, standby promoted {DETECTION_S:.0f}s later, {len(urls)} node(s): "
        f"{accepted_before_kill} single POSTs answered 2xx before the kill, {accepted()} in all, "
        f"{len(refused)} refused (statuses {sorted(set(refused))}); first job fired after the "
        f"promotion {resumed_at - killed_at:.2f}s after the kill; {ledger}"
    )
    return Outcome(seen, refused_during_switch, ledger)


def assert_switch_cost_only_503s(outcome: Outcome) -> None:
    assert outcome.refused_during_switch > 0, "some POSTs met the switch"
    assert {status for tally in outcome.seen for status, _ in tally.refused} == {503}
    assert outcome.ledger.lost == []
    assert outcome.ledger.early == []


async def wait_listening_on_promoted(pg_pair: PrimaryWithStandby, nodes: int) -> None:
    """Due notices reach every node again: their LISTEN connections are on the new primary."""

    async def listening() -> bool:
        sessions = await asyncio.to_thread(pg_pair.standby.sql, LISTENERS, "dispatcher")
        return int(sessions) == nodes

    await until(listening, 60)


async def test_primary_killed_and_standby_promoted_loses_no_accepted_job(
    tmp_path: Path, pg_pair: PrimaryWithStandby, amqp_url: str, collector: Collector
) -> None:
    process = DispatcherProcess(
        tmp_path,
        port=reserve_port(),
        env={
            "DISPATCHER_DATABASE_URL": pg_pair.dsn("dispatcher"),
            "DISPATCHER_AMQP_URL": amqp_url,
            "DISPATCHER_DB_TIMEOUT_S": str(DB_TIMEOUT_S),
            **FAST_LEASE,
        },
    )
    process.start()
    try:
        outcome = await fail_over_while_busy(pg_pair, [process.url], collector)
        assert_switch_cost_only_503s(outcome)
        assert process.is_running(), process.logs(80)
        await wait_listening_on_promoted(pg_pair, 1)
        await assert_serving_again(process.url, collector)
    finally:
        print(process.logs(60))
        process.stop()


async def test_a_cluster_rides_through_the_failover_and_keeps_its_shards(
    tmp_path: Path,
    pg_pair: PrimaryWithStandby,
    amqp_url: str,
    zk_hosts: str,
    collector: Collector,
) -> None:
    env = {
        "DISPATCHER_DATABASE_URL": pg_pair.dsn("dispatcher"),
        "DISPATCHER_AMQP_URL": amqp_url,
        "DISPATCHER_ZK_HOSTS": zk_hosts,
        "DISPATCHER_ZK_SESSION_TIMEOUT_S": str(SESSION_S),
        "DISPATCHER_DB_TIMEOUT_S": str(DB_TIMEOUT_S),
        "DISPATCHER_LEASE_S": "4",
    }
    cluster = Cluster(tmp_path, env, shard_count=32)
    try:
        await start_nodes(cluster, "a", "b")
        urls = [node.url for node in cluster.live()]
        outcome = await fail_over_while_busy(pg_pair, urls, collector)
        assert_switch_cost_only_503s(outcome)
        assert len(cluster.live()) == 2
        await asyncio.to_thread(cluster.wait_converged, {"a", "b"})
        await wait_listening_on_promoted(pg_pair, 2)
        for url in urls:
            await assert_serving_again(url, collector)
    finally:
        for node in cluster.nodes.values():
            print(f"--- {node.name}\n{node.logs(40)}")
        cluster.stop()
