"""A ZooKeeper ensemble for a test, dispatcher nodes on it, and what a fault must leave alone:
each node's session and the shards it owns with their epochs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

from devstack.node_cluster import SHARDS, Cluster
from devstack.zookeeper_ensemble import ZooKeeperEnsemble

# The nodes' session: a leader election (a second or two, more on a loaded machine) fits well
# inside it, so losing one server must cost the nodes nothing but a pause.
ENSEMBLE_SESSION_S = 6.0


def started_ensemble(root: Path) -> Iterator[ZooKeeperEnsemble]:
    """For a fixture to yield from: three servers in quorum; stopped afterwards."""
    ensemble = ZooKeeperEnsemble(root)
    ensemble.start()
    try:
        yield ensemble
    finally:
        ensemble.stop()


def ensemble_cluster(
    log_dir: Path, database_url: str, amqp_url: str, ensemble: ZooKeeperEnsemble
) -> Iterator[Cluster]:
    """For a fixture to yield from: dispatcher processes given every server of the ensemble."""
    env = {
        "DISPATCHER_DATABASE_URL": database_url,
        "DISPATCHER_AMQP_URL": amqp_url,
        "DISPATCHER_ZK_HOSTS": f"{ensemble.hosts}/test_{uuid.uuid4().hex}",
        "DISPATCHER_ZK_SESSION_TIMEOUT_S": str(ENSEMBLE_SESSION_S),
        "DISPATCHER_LEASE_S": "4",
    }
    group = Cluster(log_dir, env, shard_count=SHARDS)
    try:
        yield group
    finally:
        for node in group.nodes.values():  # shown when the test fails
            print(f"--- {node.name}\n{node.logs()}")
        print(ensemble.logs())
        group.stop()


def ownership(cluster: Cluster) -> dict[str, tuple[int, dict[str, int]]]:
    """node -> (its ZooKeeper session id, shard -> epoch it owns): any change of ownership, a
    shard moved or taken again, or a session that expired, shows here."""
    views = {node.name: cluster.view(node.name) for node in cluster.live()}
    return {name: (view["session_id"], view["owned"]) for name, view in views.items()}


def sessions(cluster: Cluster) -> set[int]:
    return {session for session, _ in ownership(cluster).values()}
