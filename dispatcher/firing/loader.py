"""Keeps the jobs of the owned shards that fall due within the look-ahead window in memory.

Cursors walk the ``jobs_due`` index in (run_at, id) order. A *live* cursor's ``position`` says
"every scheduled job of these shards up to here is in the heap"; its ``target`` is the horizon it
is being loaded to, and a job submitted to this node at or before the target is pushed straight
into the heap (``offer``), so nothing falls between a running query and a commit. Shards taken
over (and all shards at start) also get a *backlog* cursor for the jobs already overdue, which go
to the Backlog lane: they drain oldest first without holding up the jobs falling due meanwhile.

When the live lane falls more than ``live_lag_s`` behind (a burst larger than firing can take at
once, or an overload), what is that late moves to the backlog lane: a backlog cursor takes over
the range, and the live cursor jumps to the present, so the jobs falling due now are loaded and
fired on time while the burst drains beside them (at the catch-up pace, keys taking turns).

Claims whose lease ran out and stragglers no load picked up are found by ``sweep`` on a timer of
its own and go to a third lane, the recovery lane, which firing serves first and unpaced. So do
the claims a previous owner of a shard left (made under an earlier epoch: it died, or lost the
shard), found by a sweep run as soon as the shard is taken: a dead owner's fire again at once,
not a lease later; a live owner's (still in the cluster) once it had the time to confirm and mark
them itself (``SweepTimes.handover_s``), so that a claim it published is not published again.

The lanes themselves, and how a firing batch is made of them, are ``lanes.Lanes``: the loader
fills them, the firer takes from them.

Memory is bounded: the heap holds at most ``heap_cap`` entries (plus the submissions pushed
between two loads, trimmed back to the cap), the backlog at most ``backlog_cap``, the recovery
lane what one sweep finds (``load_batch``) that is not fired yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from consumers_sdk import validation
from dispatcher import models
from dispatcher.firing import lanes
from dispatcher.firing.admission import OPEN, Admission
from dispatcher.models import DueEntry
from dispatcher.store.jobs import EVER, JobStore
from dispatcher.timing.kinds import NodeTime

logger = logging.getLogger(__name__)

MIN_ID = uuid.UUID(int=0)
MAX_ID = uuid.UUID(int=(1 << 128) - 1)
BEGINNING = validation.EARLIEST_DUE  # no job is due before it (the API's bound)
TRIM_SLACK = 1.1  # trim once submissions have pushed the heap this far past its cap
# The full looks (the straggler look, which reads jobs_due from its lowest entry, and the look at
# every lease run out) walk, while a snapshot is held, a dead entry for every job fired since:
# after such a look took d seconds, the next waits at least FULL_LOOK_SPACING * d, so that it
# never takes more than 1/FULL_LOOK_SPACING of the time (a few milliseconds normally: every
# sweep; 100 ms under a long hold: every 5 s at most).
FULL_LOOK_SPACING = 50.0
# Between full looks, the lease look reads only the leases run out since the last complete one,
# less this much: a claim committed after that look set its lease from its own start, at most a
# few seconds before its commit. (A claim slower than its lease and this is left to a full look.)
LEASE_LOOK_BACK_S = 5.0
# The full lease look, a net under the windowed one, comes at most this often (and after each
# takeover): cheap as it is without a held snapshot, it grows with one until spaced by its cost.
FULL_LEASE_LOOK_EVERY_S = 60.0
# A load or a sweep that PostgreSQL cut off is run again by the supervisor at this pace.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowLimits:
    """How far ahead the live lane is loaded, how much memory the lanes may hold, how many rows
    a query reads, and how late the live lane may fall before its late jobs go to the backlog."""

    lookahead_s: float
    heap_cap: int
    load_batch: int
    live_lag_s: float = 2.0

    @property
    def backlog_cap(self) -> int:
        return max(self.load_batch, self.heap_cap // 4)


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepTimes:
    """How often the sweep runs, how overdue a job no load picked up must be to be swept, and
    how long a live previous owner has to settle a claim it made before it is fired again."""

    every_s: float
    grace_s: float
    handover_s: float = 0.0


@dataclass(eq=False)
class Cursor:
    shards: set[int]
    position: tuple[datetime, uuid.UUID]
    target: datetime
    end: datetime | None = None  # backlog cursors stop here
    target_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.target_s = self.target.timestamp()

    def aim(self, target: datetime) -> None:
        self.target = target
        self.target_s = target.timestamp()


# What a cursor can be moved to: a row stored with an extreme run_at (before the API bounded it,
# or written by hand) must not make the arithmetic on cursors raise.
_EARLIEST_S = datetime(1, 1, 2, tzinfo=UTC).timestamp()
_LATEST_S = datetime(9999, 12, 30, tzinfo=UTC).timestamp()


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(min(max(seconds, _EARLIEST_S), _LATEST_S), UTC)


class Loader:
    def __init__(
        self,
        store: JobStore,
        due_lanes: lanes.Lanes,
        *,
        window: WindowLimits,
        sweeps: SweepTimes,
        now: NodeTime,
        members: Callable[[], frozenset[str]] = frozenset,
        admission: Admission = OPEN,
    ) -> None:
        """Fills ``due_lanes`` and hears of every batch taken from them (``on_taken``).
        ``members``: the nodes in the cluster now, whose claims may still be in flight;
        ``admission``: what flow control holds, which the loads and sweeps pass over."""
        self._store = store
        self._lanes = due_lanes
        due_lanes.when_taken(self.on_taken)
        self._lookahead_s = window.lookahead_s
        self._heap_cap = window.heap_cap
        self._backlog_cap = window.backlog_cap
        self._load_batch = window.load_batch
        self._live_lag_s = window.live_lag_s
        self._lease_sweep_s = sweeps.every_s
        self._sweep_grace_s = sweeps.grace_s
        self._handover_s = sweeps.handover_s
        self._members = members
        self._admission = admission
        self._demoted_at_s = 0.0
        self._now = now
        self._epochs: dict[int, int] = {}  # shard -> the epoch held: older claims are orphans
        # Whether claims of an earlier epoch may remain: only a takeover makes them, and a sweep
        # that found them all (with no takeover meanwhile: ``_takeovers``) ends the looking.
        # Each look reads every claim's row, whose dead versions a held snapshot keeps.
        self._orphans_possible = False
        self._takeovers = 0
        self._first_epochs: dict[int, int] = {}  # shard -> the first epoch this process took
        self._orphan_ripe_in_s: float | None = None  # a live owner's claim waits that long
        self._stragglers_after = 0.0  # (monotonic) no straggler look before
        self._full_lease_look_after = 0.0  # (monotonic) no full lease look before
        # Every lease run out before this (PostgreSQL's clock) was found by a complete look; None:
        # none yet over the shards held (the next look is a full one).
        self._leases_seen_to: datetime | None = None
        self._sweep_now = asyncio.Event()
        self._live: list[Cursor] = []
        self._backlogs: list[Cursor] = []
        self._wake = asyncio.Event()
        self._releases = 0  # how many times ``release`` rewound the cursors
        self._on_offered: Callable[[Sequence[DueEntry]], None] = lambda _entries: None

    # --- ownership ------------------------------------------------------------------------------

    def gain(self, epochs: Mapping[int, int]) -> None:
        """Start loading newly owned shards (with the epochs they were taken under): overdue jobs
        to the backlog, the window to the heap, a previous owner's claims to the recovery lane."""
        if not epochs:
            return
        shards = set(epochs)
        self._epochs.update(epochs)
        for shard, epoch in epochs.items():
            self._first_epochs.setdefault(shard, epoch)
        self._takeovers += 1
        self._orphans_possible = True
        self._leases_seen_to = None
        self._sweep_now.set()
        now = _at(self._now())
        self._backlogs.append(Cursor(set(shards), (BEGINNING, MIN_ID), now, end=now))
        self._live.append(Cursor(set(shards), (now, MAX_ID), now))
        self._wake.set()

    def lose(self, shards: Collection[int]) -> None:
        """Forget shards another node now owns; their entries leave memory."""
        lost = set(shards)
        if not lost:
            return
        for shard in lost:
            self._epochs.pop(shard, None)
        for cursor in (*self._live, *self._backlogs):
            cursor.shards -= lost
        self._live = [cursor for cursor in self._live if cursor.shards]
        self._backlogs = [cursor for cursor in self._backlogs if cursor.shards]
        self._lanes.retain(lambda entry: entry.shard not in lost)

    # --- intake ---------------------------------------------------------------------------------

    def covers(self, shard: int, run_at_s: float) -> bool:
        """Whether a job stored now must be pushed here because no load will pick it up."""
        return any(shard in cursor.shards and run_at_s <= cursor.target_s for cursor in self._live)

    def when_offered(self, callback: Callable[[Sequence[DueEntry]], None]) -> None:
        """Hand ``callback`` every job offered (the flow meter: one of a metered key, whose
        loads pass it over, may have been stored behind its look)."""
        self._on_offered = callback

    def offer(self, entries: Iterable[DueEntry]) -> None:
        """Push freshly stored jobs that fall inside the loaded window."""
        offered = list(entries)
        self._on_offered(offered)
        self._lanes.offer(entry for entry in offered if self.covers(entry.shard, entry.run_at_s))
        if self._lanes.live_count > self._heap_cap * TRIM_SLACK:
            self._trim()

    def rewind(self, back_s: float) -> None:
        """Load the window again from ``back_s`` ago: jobs may have entered it unannounced (due
        notices missed while their connection was down)."""
        back = (_at(self._now() - back_s), MIN_ID)
        for cursor in self._live:
            cursor.position = min(cursor.position, back)
        self._wake.set()

    def release(self) -> None:
        """Jobs the loads passed over may be held no more (a flow rule let them go): a backlog
        cursor walks again everything due up to now, oldest first (at the catch-up pace, keys
        taking turns), and the live cursors load the window again from now. A load that ran
        meanwhile, under the rules before, moves no cursor (``_load``)."""
        shards = set().union(*(cursor.shards for cursor in self._live))
        if not shards:
            return
        self._releases += 1
        now = _at(self._now())
        self._backlogs = [Cursor(shards, (BEGINNING, MIN_ID), now, end=now)]
        for cursor in self._live:
            cursor.position = min(cursor.position, (now, MIN_ID))
        self._wake.set()

    def catch_up(self, due_at: datetime) -> None:
        """Jobs of the owned shards were made due at ``due_at`` (PostgreSQL's clock: a bulk
        requeue's transaction), behind the live cursors: a backlog cursor walks them, so they
        drain at the catch-up pace beside the jobs falling due, without a notice each. A cursor
        that has not passed ``due_at`` yet is stretched instead of adding one per batch."""
        shards = set().union(*(cursor.shards for cursor in self._live))
        if not shards:
            return  # no shard held: the new owner's takeover walks every overdue job
        start = (_at(due_at.timestamp() - 0.001), MIN_ID)  # a millisecond early: see ``_trim``
        for cursor in self._backlogs:
            if cursor.shards == shards and cursor.end is not None and cursor.position <= start:
                if cursor.end < due_at:
                    cursor.end = due_at
                    cursor.aim(due_at)
                break
        else:
            self._backlogs.append(Cursor(shards, start, due_at, end=due_at))
        self._wake.set()

    def on_taken(self) -> None:
        """Called by the lanes after every batch taken: load again only if a capped lane has room.

        A lane is capped while a cursor has not reached its target; waking the loader on every
        pop otherwise would run a load query per firing batch for nothing.
        """
        heap_starved = self._lanes.live_count < self._heap_cap // 2 and any(
            cursor.position[0] < cursor.target for cursor in self._live
        )
        backlog_starved = (
            bool(self._backlogs) and self._lanes.backlog_count < self._backlog_cap // 2
        )
        if heap_starved or backlog_starved or self._lagging():
            self._wake.set()

    def _lagging(self) -> bool:
        """The live lane holds jobs later than ``live_lag_s`` (checked twice per lag at most)."""
        now_s = self._now()
        if now_s - self._demoted_at_s < self._live_lag_s / 2:
            return False
        earliest = self._lanes.next_live_s()
        return earliest is not None and earliest < now_s - self._live_lag_s

    # --- loading --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Load, then sleep until the window needs extending; forever. PostgreSQL away ends it
        and the supervisor runs it again (the ``RETRY_*`` pace): the cursors, kept here, go on."""
        while True:
            await self.fill()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self._lookahead_s / 4, self._lease_sweep_s)):
                    await self._wake.wait()

    async def fill(self) -> None:
        if self._lagging():
            self._demote()
        horizon = _at(self._now() + self._lookahead_s)
        for cursor in list(self._live):
            if cursor.target < horizon:
                cursor.aim(horizon)
            budget = self._heap_cap - self._lanes.live_count
            await self._load(cursor, cursor.target, budget, live=True)
        self._merge_live()
        for cursor in list(self._backlogs):
            if self._lanes.backlog_count >= self._backlog_cap // 2:
                break
            end = cursor.end
            assert end is not None
            budget = self._backlog_cap - self._lanes.backlog_count
            done = await self._load(cursor, end, budget, live=False)
            # Not replaced by a ``release`` meanwhile, nor stretched by a ``catch_up``.
            if done and cursor in self._backlogs and cursor.end == end:
                self._backlogs.remove(cursor)

    async def _load(self, cursor: Cursor, until: datetime, budget: int, *, live: bool) -> bool:
        """Advance a cursor towards ``until`` within ``budget`` entries; True when it got there."""
        while budget > 0:
            limit = min(self._load_batch, budget)
            releases = self._releases
            entries, last = await self._store.load_due(
                sorted(cursor.shards),
                after=cursor.position,
                until=until,
                limit=limit,
                held=self._admission.held(),
            )
            if releases != self._releases:
                return False  # released meanwhile: the cursors were moved back; load from there
            if live:
                self._lanes.fill_live(entries)
            else:
                self._lanes.fill_backlog(entries)
            if len(entries) < limit or last is None:
                cursor.position = (until, MAX_ID)
                return True
            cursor.position = last
            budget -= len(entries)
        return False

    def _merge_live(self) -> None:
        """A takeover's live cursor joins the main one once it has caught up with it."""
        if len(self._live) < 2:
            return
        main = self._live[0]
        for cursor in self._live[1:]:
            if cursor.position >= main.position:
                main.shards |= cursor.shards
                self._live.remove(cursor)

    def _demote(self) -> None:
        """Hand what the live lane has left later than ``live_lag_s`` to the backlog lane."""
        now_s = self._now()
        self._demoted_at_s = now_s
        if not self._live:  # no cursor to hand the range over to: the entries stay
            return
        cutoff_s = now_s - self._live_lag_s
        demoted = self._lanes.demote(cutoff_s)
        if demoted is None:
            return
        cutoff = _at(cutoff_s)
        # Everything of the live shards from the earliest evicted entry to the cutoff is loaded
        # again by a backlog cursor (a millisecond early: float rounding may only duplicate).
        start = min(
            (_at(demoted.earliest_s - 0.001), MIN_ID), *(cursor.position for cursor in self._live)
        )
        shards = set().union(*(cursor.shards for cursor in self._live))
        self._backlogs.append(Cursor(shards, start, cutoff, end=cutoff))
        for cursor in self._live:
            cursor.position = max(cursor.position, (cutoff, MAX_ID))
            if cursor.target < cutoff:
                cursor.aim(cutoff)
        logger.warning(
            "firing is %.1fs behind: %d jobs moved to the catch-up lane",
            now_s - demoted.earliest_s,
            demoted.count,
            extra={"action": "catch-up"},
        )

    def _trim(self) -> None:
        kept = self._lanes.trim_live(self._heap_cap)
        if kept is None:
            return
        # Everything after the last kept entry must be loaded again: move the cursors back (a
        # millisecond early, so float rounding can only cause a harmless duplicate, never a miss).
        back = (_at(kept.run_at_s - 0.001), MIN_ID)
        for cursor in self._live:
            if cursor.position > back:
                cursor.position = back
            if cursor.target > back[0]:
                cursor.aim(back[0])
        self._wake.set()

    async def run_sweeps(self) -> None:
        """``sweep`` every ``lease_sweep_s``, on a timer of its own (however long a load or a
        catch-up takes, recovery is never behind it), and at once when shards are taken.
        PostgreSQL away ends it and the supervisor runs it again (the ``RETRY_*`` pace)."""
        while True:
            self._sweep_now.clear()
            await self.sweep()
            wait_s = self._lease_sweep_s
            if self._orphan_ripe_in_s is not None:  # a live owner's claim is ripe sooner
                wait_s = min(wait_s, self._orphan_ripe_in_s + 0.01)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._sweep_now.wait()

    async def sweep(self) -> int:
        """Hand back what no load will: claims never confirmed (a crash, an outage) once their
        lease ran out, and, when no backlog is draining, scheduled jobs overdue past the grace.

        They go to the recovery lane, which firing serves before the backlog and outside the
        catch-up pace, so a long catch-up never holds them up. (While a backlog drains, the
        overdue stragglers are left to it: it walks every scheduled job of its range. Otherwise
        they are looked for at most every ``FULL_LOOK_SPACING`` times the last look took.)"""
        shards = sorted(set().union(*(cursor.shards for cursor in self._live)))
        if not shards:
            return 0
        takeovers = self._takeovers
        entries = await self._expired_leases(shards)
        if entries:
            logger.info("re-firing %d jobs whose lease expired", len(entries))
        if self._orphans_possible:
            orphans = await self._store.orphaned_claims(
                self._epochs,
                self._load_batch,
                handover=models.Handover(
                    members=self._members(),
                    first_epochs=self._first_epochs,
                    grace_s=self._handover_s,
                ),
            )
            self._orphan_ripe_in_s = orphans.next_ripe_in_s
            # All found and ripe, and no takeover since: no claim of an earlier epoch is left (a
            # claim commits only under the epoch it locked, so none is made after the takeover).
            if (
                orphans.found < self._load_batch
                and orphans.next_ripe_in_s is None
                and takeovers == self._takeovers
            ):
                self._orphans_possible = False
            if orphans.ripe:
                logger.info(
                    "re-firing %d jobs claimed by a previous owner of their shard (it died or "
                    "lost the shard: its epoch is past)",
                    len(orphans.ripe),
                    extra={"action": "recover"},
                )
            entries += orphans.ripe
        # Only when nothing in memory is that late itself: otherwise firing is merely behind.
        earliest = self._lanes.next_live_s()
        lagging = earliest is not None and earliest < self._now() - self._sweep_grace_s
        looked_at = time.monotonic()
        if (
            not self._backlogs
            and not self._lanes.backlog_count
            and not lagging
            and looked_at >= self._stragglers_after
        ):
            stragglers = await self._store.overdue_stragglers(
                shards, self._sweep_grace_s, self._load_batch, held=self._admission.held()
            )
            took_s = time.monotonic() - looked_at
            self._stragglers_after = looked_at + took_s * FULL_LOOK_SPACING
            if stragglers:
                logger.warning("firing %d overdue jobs no load had picked up", len(stragglers))
            entries += stragglers
        return self._lanes.recover(entries)

    async def _expired_leases(self, shards: list[int]) -> list[DueEntry]:
        """The leases run out since the last complete look (the look's cost is what the last
        seconds left behind), and, once a minute at most and spaced by its cost, all of them:
        the net under the first."""
        takeovers = self._takeovers
        started = time.monotonic()
        full = self._leases_seen_to is None or started >= self._full_lease_look_after
        since = EVER if full or self._leases_seen_to is None else self._leases_seen_to
        entries, looked_at = await self._store.expired_leases(shards, self._load_batch, since=since)
        if full:
            took_s = time.monotonic() - started
            spacing_s = max(FULL_LEASE_LOOK_EVERY_S, took_s * FULL_LOOK_SPACING)
            self._full_lease_look_after = started + spacing_s
        # Complete, over the shards it looked at: the next look may start where this one did.
        if len(entries) < self._load_batch and takeovers == self._takeovers:
            self._leases_seen_to = looked_at - timedelta(seconds=LEASE_LOOK_BACK_S)
        return entries

    @property
    def horizon(self) -> datetime | None:
        return self._live[0].position[0] if self._live else None
