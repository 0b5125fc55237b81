"""ZooKeeper access: the only module that imports kazoo.

Layout under the cluster path (``DISPATCHER_ZK_PATH``):

    meta          {"shard_count": N}          fixed when the cluster is first created
    members/<id>  ephemeral                   one per live node
    election/n_   ephemeral sequential        lowest is the leader; others watch their predecessor
    assignment    {"generation": g, "shards": {node: [shard, ...]}}   written by the leader only
    status/<standing>.<id>  ephemeral         a node that is not well says how (``health``);
                                              one child watch shows the leader every change

Blocking kazoo calls run in a worker thread (``asyncio.to_thread``); kazoo's watches and
connection listener run on kazoo's threads and only post events through the bridge.

With ``auth`` (``DISPATCHER_ZK_AUTH``, ``user:password``) the session authenticates by digest and
every znode it creates carries an ACL granting everything to that identity and nothing to anyone
else; a tree found open to anyone (made before auth was set) gets that ACL at start. Access refused
(wrong or missing credentials) is ``errors.ZkAccessDenied``: fatal, a restart would not help.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    AuthFailedError,
    BadVersionError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    ZookeeperError,
)
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from consumers_sdk import sockets
from dispatcher import errors
from dispatcher.cluster.bridge import ThreadToLoop

logger = logging.getLogger(__name__)

ZkError: tuple[type[Exception], ...] = (ZookeeperError, KazooTimeoutError)
Denied: tuple[type[Exception], ...] = (NoAuthError, AuthFailedError)  # among ZkError: first


# How long a restart waits for kazoo's new connection loop to run: polls of this many seconds.
_LOOP_START_POLLS = 500
_LOOP_START_POLL_S = 0.01


class Session(StrEnum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class SessionChanged:
    state: Session


@dataclass(frozen=True, slots=True)
class MembersChanged:
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AssignmentChanged:
    generation: int
    shards: dict[str, list[int]]


@dataclass(frozen=True, slots=True)
class PredecessorGone:
    pass


@dataclass(frozen=True, slots=True)
class StatusChanged:
    standings: dict[str, str]  # node -> its standing, for the nodes that are not well


ZkEvent = SessionChanged | MembersChanged | AssignmentChanged | PredecessorGone | StatusChanged


def split_hosts(hosts: str, path: str) -> tuple[str, str]:
    """``h:2181/ch`` and ``/dispatcher`` -> ``h:2181`` and ``/ch/dispatcher``.

    kazoo does not create a chroot, so the chroot becomes a prefix of our own paths instead.
    """
    servers, slash, chroot = hosts.partition("/")
    base = f"/{chroot.strip('/')}" if slash and chroot.strip("/") else ""
    return servers, f"{base}/{path.strip('/')}"


def _status_node(name: str) -> str:
    return name.partition(".")[2]


def standings(names: list[str]) -> dict[str, str]:
    """Status znode names (``<standing>.<node>``) -> node: standing. Should a node have two
    (between a renewed session and its next report), the one sorted last counts."""
    return {_status_node(name): name.partition(".")[0] for name in sorted(names) if "." in name}


class _KeptAliveHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, its sockets kept alive (``sockets.keep_alive``); kazoo's own
    pings drop a connection unanswered for two thirds of the session first, as a rule."""

    def __init__(self, dead_s: float) -> None:
        super().__init__()
        self._dead_s = dead_s

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        sock = super().create_connection(*args, **kwargs)
        sockets.keep_alive(sock, self._dead_s)
        return sock


class ZkSession:
    def __init__(
        self,
        hosts: str,
        path: str,
        *,
        timeout_s: float,
        events: ThreadToLoop[ZkEvent],
        auth: str = "",
        dead_connection_s: float | None = None,
    ):
        servers, self.base = split_hosts(hosts, path)
        self._events = events
        user, _, password = auth.partition(":")
        # None: kazoo's default, open to anyone (no auth configured).
        self._acl = [make_digest_acl(user, password, all=True)] if auth else None
        self._client = KazooClient(
            hosts=servers,
            timeout=timeout_s,
            connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
            command_retry=KazooRetry(max_tries=3, max_delay=0.5),
            auth_data=[("digest", auth)] if auth else None,  # sent again on every reconnect
            default_acl=self._acl,  # create, ensure_path and transactions use it
            handler=None if dead_connection_s is None else _KeptAliveHandler(dead_connection_s),
        )
        self._client.add_listener(self._on_state)
        self.election_path: str | None = None

    # --- lifecycle (blocking parts in a thread) ------------------------------------------------

    async def start(self, connect_timeout_s: float) -> None:
        try:
            await asyncio.to_thread(self._client.start, connect_timeout_s)
            if self._acl is not None:
                await asyncio.to_thread(self._secure_open_tree)
            for folder in ("members", "election", "status"):
                await asyncio.to_thread(self._client.ensure_path, f"{self.base}/{folder}")
        except ZkError as exc:
            await asyncio.to_thread(self._client.stop)
            raise self._translated(exc) from exc

    def _secure_open_tree(self) -> None:
        """In a worker thread: an existing tree open to anyone gets this identity's ACL, deepest
        znodes first (an interrupted pass leaves the root open, so the next start does it all)."""
        if self._client.exists(self.base) is None:
            return
        acls, _ = self._client.get_acls(self.base)
        if not any(acl.id.scheme == "world" for acl in acls):
            return
        logger.warning(
            "ZooKeeper: %s is open to anyone; setting the ACL of DISPATCHER_ZK_AUTH on it",
            self.base,
            extra={"action": "zk_acl"},
        )
        tree = [self.base]
        for path in tree:  # grows while walked: breadth first
            with contextlib.suppress(NoNodeError):  # an ephemeral znode gone meanwhile
                tree.extend(f"{path}/{child}" for child in self._client.get_children(path))
        for path in reversed(tree):
            with contextlib.suppress(NoNodeError):
                self._client.set_acls(path, self._acl)

    def _translated(self, exc: Exception) -> errors.DispatcherError:
        if isinstance(exc, Denied):
            return errors.ZkAccessDenied(
                f"ZooKeeper refused access to {self.base} ({type(exc).__name__}): every node of"
                " the cluster needs the same DISPATCHER_ZK_AUTH user:password"
            )
        return errors.CoordinationUnavailable(f"ZooKeeper: {exc!r}")

    async def stop(self) -> None:
        await asyncio.to_thread(self._client.stop)
        await asyncio.to_thread(self._client.close)

    def loop_ended(self) -> bool:
        """Whether kazoo's connection loop ended without being told to stop: an unexpected error
        in its thread ends it (after a LOST), and then nothing reconnects this client."""
        stopped_on_its_own: bool = self._client._connection.connection_stopped.is_set()
        return stopped_on_its_own and not self._client._stopped.is_set()

    async def restart(self) -> None:
        """Start the connection loop again after it ended on its own: it connects as after any
        loss, a new session (CONNECTED is posted), without waiting for ZooKeeper to answer."""
        # kazoo has no public call for this: ``restart`` would stop and close the session first.
        await asyncio.to_thread(self._restart)

    def _restart(self) -> None:
        # The connection's loop alone: the client was never stopped (``stop`` would queue a close
        # that the new loop would send, ending the session it makes).
        connection = self._client._connection
        connection.stop()  # joins the ended thread
        connection.start()
        # Until the new loop runs, the old one's end still shows (``loop_ended``): a LOST posted
        # meanwhile must not start it a second time.
        stopped = connection.connection_stopped
        for _ in range(_LOOP_START_POLLS):
            if not stopped.is_set():
                return
            time.sleep(_LOOP_START_POLL_S)

    @property
    def session_id(self) -> int | None:
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    def client_id(self) -> tuple[int, bytes] | None:
        """For tests that expire the session from outside (kazoo's harness technique)."""
        client_id: tuple[int, bytes] | None = self._client.client_id
        return client_id

    def _on_state(self, state: str) -> None:
        # kazoo's thread: post and return at once (a listener must not block).
        mapping = {
            KazooState.CONNECTED: Session.CONNECTED,
            KazooState.SUSPENDED: Session.SUSPENDED,
            KazooState.LOST: Session.LOST,
        }
        self._events.post(SessionChanged(mapping[state]))

    # --- cluster metadata ----------------------------------------------------------------------

    async def ensure_shard_count(self, shard_count: int) -> None:
        path = f"{self.base}/meta"
        value = json.dumps({"shard_count": shard_count}).encode()
        try:
            await self._call(self._client.create, path, value, makepath=True)
            return
        except NodeExistsError:
            pass
        data, _ = await self._call(self._client.get, path)
        existing = json.loads(data)["shard_count"]
        if existing != shard_count:
            raise errors.ShardCountMismatch(
                f"the cluster has {existing} shards; this node is configured for {shard_count}"
            )

    # --- membership and election ---------------------------------------------------------------

    async def join(self, node_id: str, info: dict[str, Any], *, wait_s: float) -> None:
        """Create this node's member and election znodes under the current session.

        A member znode of the same id left by a killed incarnation lives until its session
        expires: wait for it rather than take it over (it could be a live duplicate).
        """
        member = f"{self.base}/members/{node_id}"
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            try:
                await self._call(
                    self._client.create, member, json.dumps(info).encode(), ephemeral=True
                )
                break
            except NodeExistsError:
                stat = await self._call(self._client.exists, member)
                if stat is not None and stat.ephemeralOwner == self.session_id:
                    break
                if asyncio.get_running_loop().time() > deadline:
                    raise errors.CoordinationUnavailable(
                        f"node id {node_id!r} is already a live member"
                    ) from None
                await asyncio.sleep(0.5)
        self.election_path = await self._call(
            self._client.create,
            f"{self.base}/election/n_",
            node_id.encode(),
            ephemeral=True,
            sequence=True,
        )

    async def leave(self, node_id: str) -> None:
        for path in (self.election_path, f"{self.base}/members/{node_id}"):
            if path is None:
                continue
            with contextlib.suppress(NoNodeError):
                await self._call(self._client.delete, path)
        self.election_path = None

    async def election(self) -> list[tuple[str, str]]:
        """(znode name, node id) of every candidate, leader first."""
        folder = f"{self.base}/election"
        names = sorted(await self._call(self._client.get_children, folder))
        candidates = []
        for name in names:
            try:
                data, _ = await self._call(self._client.get, f"{folder}/{name}")
            except NoNodeError:
                continue
            candidates.append((name, data.decode()))
        return candidates

    async def watch_predecessor(self, name: str) -> bool:
        """Arm a one-shot watch on a candidate; False if it is already gone."""

        def fired(_event: object) -> None:
            self._events.post(PredecessorGone())

        stat = await self._call(self._client.exists, f"{self.base}/election/{name}", watch=fired)
        return stat is not None

    async def members(self) -> list[str]:
        return sorted(await self._call(self._client.get_children, f"{self.base}/members"))

    def watch_members(self) -> None:
        def changed(children: list[str]) -> None:
            self._events.post(MembersChanged(tuple(sorted(children))))

        self._client.ChildrenWatch(f"{self.base}/members", changed)

    # --- standings -----------------------------------------------------------------------------

    async def report(self, node_id: str, standing: str | None) -> None:
        """This node's standing: a status znode while it is not well (STANDING None: well, no
        znode). The old one goes and the new one comes in one transaction; should that fail (the
        session was renewed, the old znode is gone), each of this node's is deleted, then the
        new one made."""
        folder = f"{self.base}/status"
        mine = [name for name in await self._status_names() if _status_node(name) == node_id]
        transaction = self._client.transaction()
        for name in mine:
            transaction.delete(f"{folder}/{name}")
        if standing is not None:
            transaction.create(f"{folder}/{standing}.{node_id}", ephemeral=True)
        if not mine and standing is None:
            return
        results = await self._call(transaction.commit)
        if not any(isinstance(result, Exception) for result in results):
            return
        for name in mine:
            with contextlib.suppress(NoNodeError):
                await self._call(self._client.delete, f"{folder}/{name}")
        if standing is not None:
            with contextlib.suppress(NodeExistsError):
                await self._call(
                    self._client.create, f"{folder}/{standing}.{node_id}", ephemeral=True
                )

    async def _status_names(self) -> list[str]:
        return list(await self._call(self._client.get_children, f"{self.base}/status"))

    def watch_status(self) -> None:
        def changed(children: list[str]) -> None:
            self._events.post(StatusChanged(standings(children)))

        self._client.ChildrenWatch(f"{self.base}/status", changed)

    # --- assignment ----------------------------------------------------------------------------

    def watch_assignment(self) -> None:
        def changed(data: bytes | None, _stat: object) -> None:
            if data:
                decoded = json.loads(data)
                self._events.post(AssignmentChanged(decoded["generation"], decoded["shards"]))

        self._client.DataWatch(f"{self.base}/assignment", changed)

    async def read_assignment(self) -> tuple[AssignmentChanged, int]:
        """The current assignment and its znode version (-1 when there is none yet)."""
        try:
            data, stat = await self._call(self._client.get, f"{self.base}/assignment")
        except NoNodeError:
            return AssignmentChanged(0, {}), -1
        decoded = json.loads(data)
        return AssignmentChanged(decoded["generation"], decoded["shards"]), stat.version

    async def write_assignment(self, assignment: AssignmentChanged, version: int) -> bool:
        """Write as leader, fenced: only while our election znode exists (we still lead under a
        live session) and nobody wrote since we read ``version``. False when fenced out."""
        path = f"{self.base}/assignment"
        value = json.dumps({"generation": assignment.generation, "shards": assignment.shards})
        if self.election_path is None:
            return False
        transaction = self._client.transaction()
        transaction.check(self.election_path, 0)
        if version < 0:
            transaction.create(path, value.encode())
        else:
            transaction.set_data(path, value.encode(), version=version)
        results = await self._call(transaction.commit)
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            logger.info("assignment write fenced out: %r", failed[0])
        return not failed

    async def heartbeat(self) -> None:
        """One round trip to the server under the current session; raises if there is none."""
        await self._call(self._client.exists, f"{self.base}/members")

    async def _call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except ZkError as exc:
            raise self._translated(exc) from exc
