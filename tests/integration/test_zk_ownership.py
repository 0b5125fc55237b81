"""ZooKeeper-coordinated ownership: in-process nodes against real ZooKeeper and PostgreSQL."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from kazoo.client import KazooClient
from pydantic import SecretStr

from devstack.zookeeper import ZooKeeperServer
from dispatcher import metrics
from dispatcher.cluster.zk_ownership import ZkOwnership
from dispatcher.settings import Settings
from dispatcher.store.db import Database
from dispatcher.store.shards import ShardStore
from tests.support.waiting import eventually

# serial: its in-process members keep 2 s ZooKeeper sessions so expiry tests run fast; on a loaded
# machine their heartbeats come late, a session is lost and the shards move while the test
# checks how they are spread.
pytestmark = pytest.mark.serial

SHARDS = 24


@asynccontextmanager
async def member(
    node_id: str, zk_hosts: str, database_url: str, session_s: float = 2.0, zk_auth: str = ""
) -> AsyncIterator[ZkOwnership]:
    settings = Settings(
        zk_hosts=zk_hosts,
        node_id=node_id,
        shard_count=SHARDS,
        zk_session_timeout_s=session_s,
        database_url=database_url,
        zk_auth=SecretStr(zk_auth),
    )
    db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await db.open()
    try:  # the pool is closed when the start fails too (refused credentials, say)
        ownership = ZkOwnership(settings, ShardStore(db), metrics.Metrics())
        await ownership.start()
        task = asyncio.create_task(ownership.run(), name=f"ownership-{node_id}")
        try:
            yield ownership
        finally:
            await ownership.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await db.close()


def owned_exactly_once(nodes: list[ZkOwnership]) -> bool:
    owned = [shard for node in nodes for shard in node.epochs()]
    return sorted(owned) == list(range(SHARDS))


def expire_session(hosts: str, ownership: ZkOwnership) -> None:
    """kazoo's harness technique: a second client on the same session id closes it."""
    assert ownership._zk is not None
    client_id = ownership._zk.client_id()
    assert client_id is not None
    servers = hosts.partition("/")[0]
    intruder = KazooClient(hosts=servers, client_id=client_id, timeout=2)
    intruder.start(10)
    intruder.stop()
    intruder.close()


async def test_every_shard_is_owned_by_exactly_one_of_three_nodes(
    zk_hosts: str, database_url: str
) -> None:
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(member(f"n{i}", zk_hosts, database_url))
            for i in range(3)
        ]
        await eventually(lambda: owned_exactly_once(nodes), 20)
        assert all(len(node.epochs()) == SHARDS // 3 for node in nodes)
        await eventually(lambda: all(node.can_fire() for node in nodes), 5)
        leaders = {(await node.describe())["leader"] for node in nodes}
        assert leaders == {"n0"}


async def test_a_graceful_leave_hands_shards_over_without_waiting_for_the_session_timeout(
    zk_hosts: str, database_url: str
) -> None:
    session_s = 30.0  # far longer than the deadline below: only a clean leave can meet it
    async with member("a", zk_hosts, database_url, session_s) as a:
        async with member("b", zk_hosts, database_url, session_s) as b:
            await eventually(lambda: owned_exactly_once([a, b]), 20)
            before = dict(b.epochs())
        await eventually(lambda: owned_exactly_once([a]), 10)
        for shard, epoch in before.items():
            assert a.epochs()[shard] > epoch, "the new owner bumped the epoch"


async def test_an_expired_session_stops_firing_drops_shards_and_rejoins(
    zk_server: ZooKeeperServer, zk_hosts: str, database_url: str
) -> None:
    async with member("x", zk_hosts, database_url) as x, member("y", zk_hosts, database_url) as y:
        await eventually(lambda: owned_exactly_once([x, y]), 20)
        old_epochs = dict(x.epochs())
        changes: list[object] = []

        async def record() -> None:
            while True:
                changes.append(await x.next_change())

        # Drain the changes queued so far, then watch what the expiry does.
        while not x._changes.empty():
            x._changes.get_nowait()
        recorder = asyncio.create_task(record())
        await asyncio.to_thread(expire_session, zk_hosts, x)
        await eventually(lambda: not x.can_fire(), 5)
        await eventually(lambda: owned_exactly_once([x, y]) and x.can_fire(), 30)
        recorder.cancel()
        lost = [c for c in changes if getattr(c, "lost", None)]
        assert lost, "the expired node dropped its shards"
        regained = {s: e for s, e in x.epochs().items() if s in old_epochs}
        assert all(regained[s] > old_epochs[s] for s in regained), "regained shards re-fenced"


# The error ends kazoo's thread, which pytest reports: that is the fault injected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_a_connection_loop_ended_by_an_error_is_started_again_and_the_node_rejoins(
    zk_hosts: str, database_url: str
) -> None:
    async with member("x", zk_hosts, database_url) as x, member("y", zk_hosts, database_url) as y:
        await eventually(lambda: owned_exactly_once([x, y]), 20)
        assert x._zk is not None
        connection = x._zk._client._connection
        attempt = connection._connect_attempt

        def fail_once(*args: object) -> object:
            # An error kazoo's connection thread does not catch (libfaketime's sleep once raised
            # one in its retry), which ends the loop that would reconnect.
            connection._connect_attempt = attempt
            raise OSError(22, "Invalid argument")

        connection._connect_attempt = fail_once
        connection._socket.shutdown(socket.SHUT_RDWR)  # the loop reconnects, and ends
        await eventually(lambda: not x.can_fire(), 10)
        await eventually(
            lambda: owned_exactly_once([x, y]) and bool(x.epochs()) and x.can_fire(), 30
        )
        assert not x._zk.loop_ended()


async def test_a_new_leader_is_elected_and_assigns(zk_hosts: str, database_url: str) -> None:
    async with (
        member("first", zk_hosts, database_url) as first,
        member("second", zk_hosts, database_url) as second,
    ):
        await eventually(lambda: owned_exactly_once([first, second]), 20)
        await first.stop()  # the leader leaves
        await eventually(lambda: owned_exactly_once([second]), 20)
        assert (await second.describe())["is_leader"] is True
        async with member("third", zk_hosts, database_url) as third:
            await eventually(lambda: owned_exactly_once([second, third]), 20)


async def test_a_different_shard_count_is_refused(zk_hosts: str, database_url: str) -> None:
    async with member("one", zk_hosts, database_url):
        settings = Settings(
            zk_hosts=zk_hosts, node_id="odd", shard_count=SHARDS + 1, database_url=database_url
        )
        db = Database(database_url, min_size=1, max_size=1, timeout_s=5)
        await db.open()
        try:
            odd = ZkOwnership(settings, ShardStore(db), metrics.Metrics())
            with pytest.raises(Exception, match="shards"):
                await odd.start()
            await odd.stop()
        finally:
            await db.close()
