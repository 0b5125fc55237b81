"""Gray failures: one node of three, alive and in ZooKeeper, cut from one service by a firewall
rule on its own packets (``support.firewall``), every other path intact, while jobs fall due on
every node. The cut node says so in ``/readyz``, steps out past the bound (PostgreSQL, RabbitMQ)
or loses its session (ZooKeeper), the others fire its shards' jobs, and it takes shards back
once healed: nothing lost, nothing early, duplicates counted.

With the service itself down for every node, nobody steps out of anybody's way: the shards stay
where they are (``assignment.eligible``)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack import firewall
from devstack.collector import Collector
from devstack.dispatcher_process import DispatcherProcess
from devstack.node_cluster import SESSION_S, Cluster
from devstack.spread import run_at_s, submit_spread
from tests.support.process import served
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(not firewall.available(), reason="needs iptables (make test installs it)"),
]

STEP_OUT_S = 3.0
REJOIN_S = 3.0
STEWARD = {"DISPATCHER_STEP_OUT_S": str(STEP_OUT_S), "DISPATCHER_REJOIN_S": str(REJOIN_S)}
CUT_S = 6.0  # longer than the bound and the session
# A ZooKeeper session expires on the server's own schedule: on a loaded machine the others took
# the shards more than 5 s into a 6 s cut. The cut lasts long enough to see it.
ZK_CUT_S = 9.0


def cut_s(service: str) -> float:
    return ZK_CUT_S if service == "zookeeper" else CUT_S


# The cut node's jobs fire within this of the others taking its shards: the new owner's load and
# catch-up, on a loaded machine.
FAILOVER_SLACK_S = 4.0
# Jobs due this many a second through each cut, and for this long after it heals (the rejoin).
JOBS_PER_S = 50
AFTER_CUT_S = 4.0


@pytest.fixture
def wall() -> Iterator[firewall.Firewall]:
    with firewall.firewall() as made:
        yield made


def readyz(node_url: str) -> tuple[int, dict[str, Any]]:
    try:
        response = httpx.get(f"{node_url}/readyz", timeout=5)
    except httpx.HTTPError as exc:
        return 0, {"error": repr(exc)}
    return response.status_code, response.json()


def owned_by(cluster: Cluster, name: str, asked: str) -> list[int]:
    """The shards the assignment gives NAME, as node ASKED sees it."""
    return [int(shard) for shard in cluster.view(asked)["assignment"].get(name, {})]


def changes(seen: list[tuple[float, int, str | None]]) -> list[tuple[float, int, str | None]]:
    """The answers that differ from the one before."""
    kept = [
        answer
        for before, answer in zip([None, *seen], seen, strict=False)
        if before is None or before[1:] != answer[1:]
    ]
    return kept


# (service, node): each node cut in turn, then the first again.
PHASES = [("postgres", "n0"), ("rabbitmq", "n1"), ("zookeeper", "n2"), ("postgres", "n0")]


@dataclass
class Cut:
    """One node cut from one service for ``cut_s``: what it said (by when it was asked), when its
    shards went and came back."""

    service: str
    node: str
    shards: set[int]
    cut_at: float = 0.0
    healed_at: float = 0.0
    gone_s: float | None = None
    back_s: float | None = None
    said: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)

    def states(self) -> list[tuple[float, int, str | None]]:
        return changes(
            [
                (round(at, 1), code, answer.get("standing", {}).get("standing"))
                for at, code, answer in self.said
            ]
        )


async def cut_once(cluster: Cluster, wall: firewall.Firewall, port: int, cut: Cut) -> Cut:
    """Cut CUT.node from PORT for ``cut_s``, heal, and wait until it holds shards again and is
    ready; its /readyz is polled on a thread of its own meanwhile (an answer may take seconds)."""
    node = cluster.nodes[cut.node]
    other = next(name for name in cluster.nodes if name != cut.node)
    cut.cut_at = time.time()
    wall.cut(port)
    back = asyncio.Event()

    async def watch_readyz() -> None:
        while not back.is_set():
            asked = time.time() - cut.cut_at  # an answer may come seconds after: when asked
            status, answer = await asyncio.to_thread(readyz, node.url)
            cut.said.append((asked, status, answer))
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch_readyz())
    while time.time() < cut.cut_at + cut_s(cut.service):
        if cut.gone_s is None and not await asyncio.to_thread(owned_by, cluster, cut.node, other):
            cut.gone_s = time.time() - cut.cut_at
        await asyncio.sleep(0.1)
    wall.heal(port)
    cut.healed_at = time.time()
    await eventually(lambda: bool(owned_by(cluster, cut.node, other)), 60)
    cut.back_s = time.time() - cut.healed_at
    await eventually(lambda: readyz(node.url)[0] == 200, 20)
    back.set()
    await watcher
    return cut


@pytest.fixture
def walls() -> Iterator[dict[str, firewall.Firewall]]:
    """A group of its own for each node, so each can be cut alone."""
    with firewall.firewall() as w0, firewall.firewall() as w1, firewall.firewall() as w2:
        yield {"n0": w0, "n1": w1, "n2": w2}


async def test_a_node_cut_from_one_service_gives_its_shards_away_and_takes_them_back(
    cluster: Cluster,
    collector: Collector,
    walls: dict[str, firewall.Firewall],
    database_url: str,
    amqp_url: str,
    zk_hosts: str,
) -> None:
    """Three nodes; one at a time cut from PostgreSQL, RabbitMQ, ZooKeeper, then the first
    from PostgreSQL again (it stepped out twice in a row: it waits twice as long to rejoin)."""
    ports = {"postgres": database_url, "rabbitmq": amqp_url, "zookeeper": zk_hosts}
    for name, wall in walls.items():
        await asyncio.to_thread(cluster.start, name, STEWARD, group=wall.gid)
    await asyncio.to_thread(cluster.wait_converged, set(walls))
    jobs: list[dict[str, Any]] = []
    cuts = []
    for service, name in PHASES:
        # Before each cut, jobs due through it and a while after, in small batches round-robin:
        # each node's shards get jobs due all along (a job due soon lands on a shard of the node
        # it is submitted to). Each cut has jobs of its own however long the ones before took
        # on a loaded machine (one spread over all four once left the last with none).
        over_s = cut_s(service) + AFTER_CUT_S
        jobs += await submit_spread(
            [node.url for node in cluster.live()],
            int(JOBS_PER_S * over_s),
            over_s=over_s,
            start_in_s=1,
            batch=25,
        )
        shards = set(owned_by(cluster, name, next(n for n in walls if n != name)))
        assert shards
        cuts.append(
            await cut_once(
                cluster, walls[name], firewall.port_of(ports[service]), Cut(service, name, shards)
            )
        )
    accepted = {job["id"]: run_at_s(job) for job in jobs}
    ledger = await collector.reckon(accepted, deadline_s=120, quiet_s=1.5)

    for cut in cuts:
        # The cut node's jobs due while it was cut: how late they came.
        cut_jobs = [
            job["id"]
            for job in jobs
            if job["shard"] in cut.shards and cut.cut_at <= run_at_s(job) <= cut.healed_at
        ]
        late = collector.lateness(accepted, cut_jobs)
        # Each fired soon after its shards went (while it was cut: gone_s is measured only
        # then), or after its due time if that came later. From the moment the others held
        # them, not from the bound: how long the step-out took on a loaded machine is the
        # test's polling as much as the node's.
        taken_at = cut.cut_at + (cut.gone_s or cut_s(cut.service))
        after_taken = [
            collector.deliveries[job_id][0].received_at - max(accepted[job_id], taken_at)
            for job_id in cut_jobs
            if job_id in collector.deliveries  # the ledger counts those lost
        ]
        print(
            f"\n{cut.service} cut from {cut.node} for {cut_s(cut.service):g} s"
            f" (step-out bound {STEP_OUT_S:g} s, session {SESSION_S:g} s): its shards went to the"
            f" others {cut.gone_s or float('nan'):.2f} s"
            f" after the cut and came back {cut.back_s:.2f} s after it healed; its {len(cut_jobs)}"
            f" jobs due during the cut: lateness median {statistics.median(late):.2f} s, max"
            f" {late[-1]:.2f} s, {max(after_taken):.2f} s at most after the others took them;"
            f" its /readyz (s after the cut, status, standing) as it changed:"
            f" {cut.states()}"
        )
        assert cut.gone_s is not None, "the others took the cut node's shards"
        assert len(late) == len(cut_jobs)
        assert max(after_taken) <= FAILOVER_SLACK_S, sorted(after_taken)[-5:]
        # It said so: not ready, the service named, while it was cut.
        named = [answer for at, code, answer in cut.said if code == 503 and at < cut_s(cut.service)]
        assert named, f"/readyz said ready all along: {cut.states()}"
        if cut.service == "zookeeper":
            assert any(not answer["checks"]["zookeeper"] for answer in named)
        else:
            assert any(not answer["checks"][cut.service] for answer in named)
            assert any(answer["standing"]["standing"] == "out" for answer in named)
            assert any(cut.service in answer["standing"]["failing"] for answer in named)
    print(f"\n{ledger}")
    assert ledger.lost == []
    assert ledger.early == []
    # No flapping: back after the rejoin wait, twice as long the second time in a row.
    assert (cuts[0].back_s or 0) >= REJOIN_S
    assert (cuts[-1].back_s or 0) >= 2 * REJOIN_S


async def test_with_every_node_cut_from_postgresql_no_shard_moves_and_nothing_is_lost(
    cluster: Cluster, collector: Collector, wall: firewall.Firewall, database_url: str
) -> None:
    # All three under the one group: the database is gone for every node, as in an outage.
    for name in ("n0", "n1", "n2"):
        await asyncio.to_thread(cluster.start, name, STEWARD, group=wall.gid)
    await asyncio.to_thread(cluster.wait_converged, {"n0", "n1", "n2"})
    generation = cluster.view("n0")["generation"]
    jobs = await submit_spread(
        [node.url for node in cluster.live()], 700, over_s=9, start_in_s=2, batch=25
    )
    accepted = {job["id"]: run_at_s(job) for job in jobs}
    await asyncio.sleep(2)
    cut_at = time.time()
    wall.cut(firewall.port_of(database_url))
    standings: set[str] = set()
    generations: set[int] = set()
    while time.time() < cut_at + CUT_S:
        view = await asyncio.to_thread(cluster.view, "n0", timeout=15)
        generations.add(view["generation"])
        standings.update(view["standings"].values())
        await asyncio.sleep(0.2)
    wall.heal(firewall.port_of(database_url))
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
    late = max(collector.lateness(accepted))
    print(
        f"\nPostgreSQL cut from all three nodes for {CUT_S:g} s (step-out bound {STEP_OUT_S:g} "
        f"s): standings seen {sorted(standings)}, assignment generations {sorted(generations)} "
        f"(before: {generation}); worst lateness {late:.2f} s; {ledger}"
    )
    assert "out" in standings, "the nodes did step out"
    assert generations == {generation}, "no shard moved while every node was cut"
    assert cluster.view("n0")["generation"] == generation
    assert ledger.lost == []
    assert ledger.early == []


@pytest.fixture
def lone(
    tmp_path: Path, database_url: str, amqp_url: str, wall: firewall.Firewall
) -> Iterator[DispatcherProcess]:
    """A single node (no ZooKeeper) under the firewall's group."""
    yield from served(tmp_path, database_url, amqp_url, env=STEWARD, group=wall.gid)


async def test_a_single_node_cut_from_rabbitmq_says_so_keeps_its_shards_and_recovers(
    lone: DispatcherProcess, amqp_url: str, collector: Collector, wall: firewall.Firewall
) -> None:
    node = lone
    jobs = await submit_spread(node.url, 400, over_s=8, start_in_s=1, batch=50)
    accepted = {job["id"]: run_at_s(job) for job in jobs}
    wall.cut(firewall.port_of(amqp_url))
    await eventually(lambda: readyz(node.url)[1].get("standing", {}).get("standing") == "out", 30)
    status, answer = readyz(node.url)
    wall.heal(firewall.port_of(amqp_url))
    ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
    await eventually(lambda: readyz(node.url)[0] == 200, 30)
    print(f"\na single node cut from RabbitMQ: /readyz {status} {answer['standing']}; {ledger}")
    assert status == 503
    assert answer["checks"]["rabbitmq"] is False
    assert answer["checks"]["shards"] is True  # nobody to hand them to: it keeps them
    assert "rabbitmq" in answer["standing"]["failing"]
    assert ledger.lost == []
    assert ledger.early == []
    assert readyz(node.url)[1]["standing"]["standing"] == "ok"
