"""devstack's ZooKeeper ensemble: three servers elect one leader, a client session survives the
loss of any one server (kill -9), and a restarted server rejoins as a follower."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.retry import KazooRetry

from devstack.base import wait_until
from devstack.zookeeper_ensemble import ZooKeeperEnsemble

SESSION_S = 6.0


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    group = ZooKeeperEnsemble(tmp_path / "ensemble")
    group.start()
    yield group
    group.stop()


@pytest.fixture
def client(ensemble: ZooKeeperEnsemble) -> Iterator[KazooClient]:
    # Commands retried through a reconnection, for a minute at most.
    retry = KazooRetry(max_tries=-1, max_delay=1.0, deadline=60)
    zk = KazooClient(hosts=ensemble.hosts, timeout=SESSION_S, command_retry=retry)
    zk.start(30)
    yield zk
    zk.stop()
    zk.close()


def test_three_servers_elect_exactly_one_leader(ensemble: ZooKeeperEnsemble) -> None:
    leader = ensemble.leader()
    assert sorted(m.mode() for m in ensemble.members) == ["follower", "follower", "leader"]
    assert ensemble.followers() == [m for m in ensemble.members if m is not leader]


@pytest.mark.parametrize("victim", ["leader", "its server"])
def test_a_session_survives_the_loss_of_one_server_and_the_server_rejoins(
    ensemble: ZooKeeperEnsemble, client: KazooClient, victim: str
) -> None:
    states: list[str] = []
    client.add_listener(states.append)
    session_id = client.client_id[0]
    client.create("/alive", b"", ephemeral=True)
    assert wait_until(lambda: ensemble.serving(session_id) is not None, 10), ensemble.logs()
    killed = ensemble.leader() if victim == "leader" else ensemble.serving(session_id)
    assert killed is not None

    killed.kill()

    client.retry(client.create, "/after", b"written after the loss")
    assert client.client_id[0] == session_id
    assert client.exists("/alive") is not None  # the ephemeral znode lives: the session did
    assert KazooState.LOST not in states
    assert ensemble.serving(session_id) not in (None, killed)  # another server took it
    new_leader = ensemble.leader()

    killed.start()
    assert killed.mode() == "follower"
    assert ensemble.leader() is new_leader
    assert client.retry(client.get, "/after")[0] == b"written after the loss"
