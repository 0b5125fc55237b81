"""Three dispatcher nodes on a three-server ZooKeeper ensemble, jobs due continuously, and one
server killed (kill -9): the leader, or a follower serving nodes' sessions. The sessions survive,
so no shard moves or is taken again (same session ids, same shards, same epochs), none is left
unowned, nothing is lost or fired twice, and firing pauses at most for about a session."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devstack.collector import Collector
from devstack.node_cluster import Cluster, start_nodes
from devstack.spread import schedule_spread
from devstack.zk_ownership import (
    ENSEMBLE_SESSION_S,
    ensemble_cluster,
    ownership,
    sessions,
    started_ensemble,
)
from devstack.zookeeper_ensemble import EnsembleMember, ZooKeeperEnsemble
from tests.support.waiting import eventually

pytestmark = pytest.mark.faults

NODES = ("n0", "n1", "n2")
# The longest silence allowed between two deliveries while jobs are due every few milliseconds.
# A node stops firing when its server goes (SUSPENDED) and starts again once reconnected; a
# reconnection slower than the session would have expired the session. Generous: a loaded
# machine elects slowly.
PAUSE_BOUND_S = 2 * ENSEMBLE_SESSION_S + 5

Pick = Callable[[ZooKeeperEnsemble, Cluster], EnsembleMember]


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    yield from started_ensemble(tmp_path / "ensemble")


@pytest.fixture
def ha_cluster(
    tmp_path: Path, database_url: str, amqp_url: str, ensemble: ZooKeeperEnsemble
) -> Iterator[Cluster]:
    yield from ensemble_cluster(tmp_path, database_url, amqp_url, ensemble)


def leader(ensemble: ZooKeeperEnsemble, _cluster: Cluster) -> EnsembleMember:
    return ensemble.leader()


def busiest_follower(ensemble: ZooKeeperEnsemble, cluster: Cluster) -> EnsembleMember:
    """The follower serving most of the nodes' sessions (so its loss moves some of them)."""
    ids = sessions(cluster)
    return max(ensemble.followers(), key=lambda m: sum(m.serves(sid) for sid in ids))


def pause_after(arrivals: list[float], killed_at: float) -> tuple[float, float]:
    """(the longest gap between deliveries from the kill on, from the kill to its end)."""
    times = sorted(t for t in arrivals if t >= killed_at - 1)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    gap_at = max(range(len(gaps)), key=gaps.__getitem__)
    return gaps[gap_at], times[gap_at + 1] - killed_at


def lateness(collector: Collector, accepted: dict[str, float], around: float) -> str:
    """Lateness percentiles of the jobs due within ten seconds either side of the kill."""
    late = sorted(
        min(d.received_at for d in collector.deliveries[job_id]) - due
        for job_id, due in accepted.items()
        if abs(due - around) <= 10 and job_id in collector.deliveries
    )
    cuts = statistics.quantiles(late, n=100)
    return f"lateness p50={cuts[49]:.2f}s p99={cuts[98]:.2f}s max={late[-1]:.2f}s"


@pytest.mark.parametrize("pick", [leader, busiest_follower], ids=["leader", "follower"])
async def test_losing_one_zookeeper_server_moves_no_shard_and_loses_nothing(
    ha_cluster: Cluster, ensemble: ZooKeeperEnsemble, collector: Collector, pick: Pick
) -> None:
    await start_nodes(ha_cluster, *NODES)
    before = await asyncio.to_thread(ownership, ha_cluster)
    accepted = await schedule_spread([n.url for n in ha_cluster.live()], 1600, over_s=20, batch=250)
    await eventually(lambda: len(collector.deliveries) >= 300, 60)
    victim = await asyncio.to_thread(pick, ensemble, ha_cluster)
    role = await asyncio.to_thread(victim.mode)
    ids = await asyncio.to_thread(sessions, ha_cluster)
    served = sum([await asyncio.to_thread(victim.serves, sid) for sid in ids])
    killed_at = time.time()
    await asyncio.to_thread(victim.kill)
    leader_after = await asyncio.to_thread(ensemble.leader)  # elected anew, or still there
    await asyncio.to_thread(victim.start)  # rejoins as a follower while jobs keep firing

    ledger = await collector.reckon(accepted, deadline_s=120, quiet_s=2.0)
    arrivals = [d.received_at for got in collector.deliveries.values() for d in got]
    longest, resumed_s = pause_after(arrivals, killed_at)
    print(
        f"\nZooKeeper {role} zk{victim.server_id} serving {served} of the nodes' sessions killed"
        f" (leader now zk{leader_after.server_id}):"
        f" longest pause {longest:.2f}s, ending {resumed_s:.2f}s after the kill,"
        f" {lateness(collector, accepted, killed_at)}; {ledger}"
    )
    assert ledger.lost == []
    assert ledger.early == []
    assert ledger.duplicated == {}
    assert await asyncio.to_thread(ownership, ha_cluster) == before  # sessions, shards, epochs
    assert await asyncio.to_thread(ha_cluster.converged, set(NODES))  # no shard unowned
    assert await asyncio.to_thread(victim.mode) == "follower"
    assert longest < PAUSE_BOUND_S
