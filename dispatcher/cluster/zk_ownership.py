"""Shard ownership coordinated through ZooKeeper; the same Ownership interface as SingleNode.

The leader (lowest election znode) computes a sticky, balanced assignment whenever membership
changes and writes it, fenced by its own election znode. Every node applies the assignment to
its shards, each of which moves through this state machine:

    UNOWNED   --assigned to this node-->          ACQUIRING  (epoch bump in PostgreSQL under way)
    ACQUIRING --bump committed-->                 OWNED      (the scheduler may claim its jobs)
    OWNED     --assigned elsewhere, or LOST-->    RELEASING  (the scheduler drops it from memory)
    RELEASING --dropped-->                        UNOWNED

A new owner bumps the shard's epoch before loading it, and every claim checks the epoch, so a
previous owner (paused, partitioned, slow to notice) cannot claim its jobs any more. On top of
that a node fences itself by time: it fires only while its last successful round trip to
ZooKeeper is more recent than the session timeout minus a margin (a paused process may not
notice its session expired). SUSPENDED stops firing at once; LOST drops every shard and rejoins.

A node that cannot do its work while it is still in ZooKeeper (cut from PostgreSQL or RabbitMQ,
its clock untrusted: ``dispatcher.health``) reports its standing in a status znode; the leader
deals no shard to a node that stepped out, as long as another node has been well for the
step-out bound (``assignment.eligible``), so the others fire its jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from enum import StrEnum

from dispatcher import errors, metrics, supervision
from dispatcher.cluster import zk
from dispatcher.cluster.assignment import assign, eligible
from dispatcher.cluster.bridge import ThreadToLoop
from dispatcher.cluster.ownership import OwnershipChange
from dispatcher.settings import Settings
from dispatcher.store.shards import ShardStore
from dispatcher.timing.kinds import Mono

logger = logging.getLogger(__name__)

_UNKNOWN = object()  # this node's standing as written to ZooKeeper: not known (a new session)
# How often the leader looks whether a member that stepped out may have its shards dealt out.
STANDINGS_TICK_S = 0.5
# Taking shards retried while PostgreSQL is away.
BUMP_FIRST_S = 0.2
BUMP_MAX_S = 5.0
# Starting kazoo's connection loop again after it ended on an error, retried while that fails.
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 10.0


class ShardState(StrEnum):
    UNOWNED = "unowned"
    ACQUIRING = "acquiring"
    OWNED = "owned"
    RELEASING = "releasing"


class ZkOwnership:
    def __init__(
        self,
        settings: Settings,
        shard_store: ShardStore,
        metrics: metrics.Metrics,
        *,
        mono: Mono = time.monotonic,
    ) -> None:
        self._settings = settings
        self._node_id = settings.node_id
        self._shard_count = settings.shard_count
        self._shard_store = shard_store
        self._metrics = metrics
        self._mono = mono
        timeout_s = settings.zk_session_timeout_s
        self._fence_s = timeout_s - max(0.5, timeout_s / 4)
        self._heartbeat_s = max(0.1, timeout_s / 6)
        self._states: dict[int, ShardState] = {}
        self._epochs: dict[int, int] = {}
        self._changes: asyncio.Queue[OwnershipChange] = asyncio.Queue()
        self._fire_ok = asyncio.Event()
        self._last_ok = float("-inf")
        self._connected = False
        self._joined = False
        self._stopping = False
        self._is_leader = False
        self._leader: str | None = None
        self._members: tuple[str, ...] = ()
        self._assignment = zk.AssignmentChanged(0, {})
        self._changed_at = mono()
        # Standings: this node's, as it wants it reported (None: well) and as last written; every
        # node's that is not well; since when the leader has seen each member well; the members
        # the last assignment was dealt to.
        self._standing: str | None = None
        self._reported: object = _UNKNOWN  # str | None once written
        self._report_wake = asyncio.Event()
        self._standings: dict[str, str] = {}
        self._well_since: dict[str, float] = {}
        self._settle_s = settings.step_out_s
        self._dealt: list[str] | None = None
        self._events: ThreadToLoop[zk.ZkEvent] | None = None
        self._zk: zk.ZkSession | None = None
        metrics.since_assignment_change.set_function(lambda: self._mono() - self._changed_at)

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._zk is not None:
            return
        self._events = ThreadToLoop(asyncio.get_running_loop())
        self._zk = zk.ZkSession(
            self._settings.zk_hosts,
            self._settings.zk_path,
            timeout_s=self._settings.zk_session_timeout_s,
            events=self._events,
            auth=self._settings.zk_auth.get_secret_value(),
            dead_connection_s=self._settings.dead_connection_s,
        )
        session = self._zk
        try:
            await session.start(connect_timeout_s=max(10.0, self._settings.zk_session_timeout_s))
            await session.ensure_shard_count(self._shard_count)
            await self._shard_store.ensure(self._shard_count)
            self._connected = True
            await self._join()
        except BaseException:
            # Not started: the node may try again (ZooKeeper or PostgreSQL not there yet).
            self._zk = None
            self._connected = False
            with contextlib.suppress(Exception):
                await session.stop()
            raise
        session.watch_members()
        session.watch_assignment()
        session.watch_status()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._process_events(), name="zk-events")
            group.create_task(self._heartbeat(), name="zk-heartbeat")
            group.create_task(self._report_standing(), name="zk-standing")
            group.create_task(self._watch_standings(), name="zk-standings")

    async def stop(self) -> None:
        """Leave the cluster at once so others take the shards without waiting for a timeout.
        With ZooKeeper out of reach there is no one to tell (kazoo would hold the request until
        it is back, and the node would never stop): the session expires there on its own."""
        if self._stopping or self._zk is None:
            return
        self._stopping = True
        self._fire_ok.clear()
        if self._connected:
            try:
                async with asyncio.timeout(self._settings.zk_session_timeout_s):
                    await self._zk.leave(self._node_id)
            except (errors.CoordinationUnavailable, TimeoutError) as exc:
                logger.warning("could not leave the cluster cleanly: %r", exc)
        await self._zk.stop()  # also ends the calls still waiting for ZooKeeper

    # --- the Ownership interface ----------------------------------------------------------------

    def epochs(self) -> Mapping[int, int]:
        return self._epochs

    def can_fire(self) -> bool:
        return (
            self._connected
            and self._joined
            and not self._stopping
            and self._mono() - self._last_ok < self._fence_s
        )

    async def wait_can_fire(self) -> None:
        while not self.can_fire():
            self._fire_ok.clear()
            await self._fire_ok.wait()

    async def next_change(self) -> OwnershipChange:
        return await self._changes.get()

    async def describe(self) -> dict[str, object]:
        try:
            epochs = {shard: epoch for shard, epoch, _ in await self._shard_store.epochs()}
        except errors.StoreUnavailable:
            # The view is wanted most while PostgreSQL is out of reach: the epochs this node
            # holds, null for the others'.
            epochs = dict(self._epochs)
        return {
            "mode": "zookeeper",
            "node": self._node_id,
            "leader": self._leader,
            "is_leader": self._is_leader,
            "members": list(self._members),
            "generation": self._assignment.generation,
            "assignment": {
                member: {str(shard): epochs.get(shard) for shard in shards}
                for member, shards in self._assignment.shards.items()
            },
            "owned": {str(shard): epoch for shard, epoch in sorted(self._epochs.items())},
            "can_fire": self.can_fire(),
            "session_id": self._zk.session_id if self._zk else None,
            "standings": dict(sorted(self._standings.items())),
        }

    async def report(self, standing: str | None) -> None:
        """This node's standing (None: well), written to ZooKeeper by ``_report_standing``."""
        if standing != self._standing:
            self._standing = standing
            self._report_wake.set()

    def coordinated(self) -> bool:
        return self._connected and self._joined

    def members(self) -> frozenset[str]:
        """As last seen: a member that left meanwhile has its claims waited for a little longer
        (``loader.SweepTimes.handover_s``), never less."""
        return frozenset(self._members) | {self._node_id}

    # --- events from kazoo's threads ------------------------------------------------------------

    async def _process_events(self) -> None:
        assert self._events is not None
        while True:
            event = await self._events.get()
            try:
                await self._handle(event)
            except errors.CoordinationUnavailable as exc:
                logger.warning("ZooKeeper: %s (waiting for the session to settle)", exc)

    async def _handle(self, event: zk.ZkEvent) -> None:
        match event:
            case zk.SessionChanged(zk.Session.SUSPENDED):
                logger.warning("ZooKeeper session suspended: firing stops")
                self._connected = False
            case zk.SessionChanged(zk.Session.LOST):
                logger.warning("ZooKeeper session lost: dropping every shard, rejoining")
                self._connected = False
                self._joined = False
                self._is_leader = False
                self._reported = _UNKNOWN  # its status znode went with the session
                self._release(set(self._states))
                await self._restart_if_ended()
            case zk.SessionChanged(zk.Session.CONNECTED):
                self._connected = True
                if not self._joined and not self._stopping:
                    await self._join()
            case zk.MembersChanged(members):
                self._members = members
                if self._is_leader:
                    await self._rebalance()
            case zk.PredecessorGone():
                await self._elect()
            case zk.AssignmentChanged() as assignment:
                await self._apply(assignment)
            case zk.StatusChanged(standings):
                await self._standings_changed(standings)

    async def _restart_if_ended(self) -> None:
        """kazoo reconnects after a loss on its own, unless an unexpected error ended its
        connection thread (seen: an ``OSError`` out of its retry's sleep): then the session is
        started again here, with pauses while that fails, so the node rejoins either way."""
        backoff = supervision.Backoff(first_s=RESTART_FIRST_S, max_s=RESTART_MAX_S)
        while self._zk is not None and not self._stopping and self._zk.loop_ended():
            logger.warning(
                "ZooKeeper: kazoo's connection loop ended on an error; starting it again",
                extra={"action": "zk_restart"},
            )
            try:
                await self._zk.restart()
            except Exception:
                delay = backoff.next()
                logger.exception(
                    "ZooKeeper: starting the connection again failed; again in %.1fs", delay
                )
                await asyncio.sleep(delay)

    async def _heartbeat(self) -> None:
        """Prove the session alive; firing is allowed only shortly after a proof."""
        assert self._zk is not None
        while True:
            sent_at = self._mono()
            try:
                async with asyncio.timeout(self._fence_s):
                    await self._zk.heartbeat()
                if self._connected and self._joined:
                    self._last_ok = sent_at
                    self._fire_ok.set()
            except (errors.CoordinationUnavailable, TimeoutError):
                pass
            await asyncio.sleep(self._heartbeat_s)

    # --- membership, election, assignment -------------------------------------------------------

    async def _join(self) -> None:
        assert self._zk is not None
        info = {
            "http": f"{self._settings.http_host}:{self._settings.http_port}",
            "pid": os.getpid(),
        }
        await self._zk.join(self._node_id, info, wait_s=2 * self._settings.zk_session_timeout_s + 5)
        self._joined = True
        self._reported = _UNKNOWN
        self._report_wake.set()
        logger.info("joined the cluster as %s", self._node_id, extra={"action": "zk_join"})
        await self._elect()
        current, _ = await self._zk.read_assignment()
        await self._apply(current)

    async def _elect(self) -> None:
        assert self._zk is not None
        while self._zk.election_path is not None:
            mine = self._zk.election_path.rsplit("/", 1)[-1]
            candidates = await self._zk.election()
            names = [name for name, _ in candidates]
            if mine not in names:
                return  # our session ended; LOST will rejoin
            self._leader = candidates[0][1]
            position = names.index(mine)
            if position == 0:
                if not self._is_leader:
                    logger.info("elected leader", extra={"action": "zk_leader"})
                self._is_leader = True
                await self._rebalance()
                return
            self._is_leader = False
            if await self._zk.watch_predecessor(names[position - 1]):
                return

    async def _rebalance(self) -> None:
        """Leader only: write a new assignment when membership changed the answer."""
        assert self._zk is not None
        for _ in range(5):
            current, version = await self._zk.read_assignment()
            members = await self._zk.members()
            dealt = eligible(members, self._standings, self._well_for(members), self._settle_s)
            self._dealt = dealt
            shards = assign(dealt, self._shard_count, current.shards)
            if shards == current.shards:
                return
            proposal = zk.AssignmentChanged(current.generation + 1, shards)
            if await self._zk.write_assignment(proposal, version):
                self._metrics.rebalances.inc()
                away = sorted(set(members) - set(dealt))
                logger.info(
                    "assignment %d written for %d members%s",
                    proposal.generation,
                    len(members),
                    f" (none for {', '.join(away)}: stepped out)" if away else "",
                    extra={"action": "zk_assign"},
                )
                return
            if self._zk.election_path is None or not self._is_leader:
                return

    async def _standings_changed(self, standings: dict[str, str]) -> None:
        now = self._mono()
        for member in standings:
            self._well_since.pop(member, None)
        for member in self._standings.keys() - standings.keys():
            self._well_since[member] = now
        if standings != self._standings:
            logger.info(
                "standings of the nodes that are not well: %s",
                standings or "none",
                extra={"action": "zk_standings"},
            )
        self._standings = standings
        if self._is_leader:
            await self._rebalance()

    def _well_for(self, members: list[str]) -> dict[str, float]:
        """How long the leader has seen each member well (from when it first saw it, if so)."""
        now = self._mono()
        return {
            member: now - self._well_since.setdefault(member, now)
            for member in members
            if member not in self._standings
        }

    async def _report_standing(self) -> None:
        """Write this node's standing whenever it changes (and again after a new session)."""
        while True:
            await self._report_wake.wait()
            self._report_wake.clear()
            standing = self._standing
            if self._zk is None or not self.coordinated() or standing == self._reported:
                continue
            try:
                await self._zk.report(self._node_id, standing)
            except errors.CoordinationUnavailable as exc:
                logger.warning("standing not reported yet: %s", exc)
                await asyncio.sleep(1.0)
                self._report_wake.set()
                continue
            self._reported = standing

    async def _watch_standings(self) -> None:
        """Leader only: a member that stepped out gets its shards dealt to others once another
        has been well long enough (``eligible``), which time alone can bring about."""
        while True:
            await asyncio.sleep(STANDINGS_TICK_S)
            if not self._is_leader or self._dealt is None:
                continue
            members = list(self._members)
            dealt = eligible(members, self._standings, self._well_for(members), self._settle_s)
            if set(dealt) != set(self._dealt):
                try:
                    await self._rebalance()
                except errors.CoordinationUnavailable as exc:
                    logger.warning("ZooKeeper: %s (rebalancing later)", exc)

    async def _apply(self, assignment: zk.AssignmentChanged) -> None:
        if assignment.generation < self._assignment.generation:
            return
        if assignment.generation != self._assignment.generation:
            self._changed_at = self._mono()
        self._assignment = assignment
        if not self._joined:
            return
        target = set(assignment.shards.get(self._node_id, []))
        self._release(set(self._states) - target)
        gained = sorted(target - set(self._states))
        if not gained:
            return
        for shard in gained:
            self._states[shard] = ShardState.ACQUIRING
        epochs = await self._bump(gained)
        for shard, epoch in epochs.items():
            if self._states.get(shard) is ShardState.ACQUIRING:
                self._states[shard] = ShardState.OWNED
                self._epochs[shard] = epoch
        self._changes.put_nowait(OwnershipChange(gained=epochs))

    async def _bump(self, shards: list[int]) -> dict[int, int]:
        """The shards' new epochs, retried while PostgreSQL is away: the shards wait in
        ``ACQUIRING`` meanwhile (a restart would lose them), and the loop reports itself
        degraded to its supervisor."""
        backoff = supervision.Backoff(first_s=BUMP_FIRST_S, max_s=BUMP_MAX_S)
        while True:
            try:
                epochs = await self._shard_store.bump(shards, self._node_id)
            except errors.StoreUnavailable as exc:
                delay = backoff.next()
                supervision.report_degraded("taking shards", exc)
                logger.warning("cannot take shards yet (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            if backoff.failures:
                supervision.report_recovered("taking shards")
            return epochs

    def _release(self, shards: set[int]) -> None:
        if not shards:
            return
        for shard in shards:
            self._states[shard] = ShardState.RELEASING
            self._epochs.pop(shard, None)
        self._changes.put_nowait(OwnershipChange(lost=frozenset(shards)))
        for shard in shards:
            del self._states[shard]
