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
shard), found by a sweep run as soon as the shard is taken: they fire again at once, not a lease
later.

Memory is bounded: the heap holds at most ``heap_cap`` entries (plus the submissions pushed
between two loads, trimmed back to the cap), the backlog at most ``backlog_cap``, the recovery
lane what one sweep finds (``load_batch``) that is not fired yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from consumers_sdk import validation
from dispatcher import errors
from dispatcher.firing.heap import Backlog, DueHeap
from dispatcher.models import DueEntry
from dispatcher.store.jobs import JobStore

logger = logging.getLogger(__name__)

MIN_ID = uuid.UUID(int=0)
MAX_ID = uuid.UUID(int=(1 << 128) - 1)
BEGINNING = validation.EARLIEST_DUE  # no job is due before it (the API's bound)
TRIM_SLACK = 1.1  # trim once submissions have pushed the heap this far past its cap


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
        heap: DueHeap,
        backlog: Backlog,
        *,
        lookahead_s: float,
        heap_cap: int,
        load_batch: int,
        lease_sweep_s: float,
        sweep_grace_s: float,
        live_lag_s: float = 2.0,
        clock: Callable[[], float],
        on_due: Callable[[], None],
    ) -> None:
        self._store = store
        self._heap = heap
        self._backlog = backlog
        self._lookahead_s = lookahead_s
        self._heap_cap = heap_cap
        self._backlog_cap = max(load_batch, heap_cap // 4)
        self._load_batch = load_batch
        self._lease_sweep_s = lease_sweep_s
        self._sweep_grace_s = sweep_grace_s
        self._live_lag_s = live_lag_s
        self._demoted_at_s = 0.0
        self.demoted = 0  # entries moved from the live lane to the backlog lane, ever
        self._clock = clock
        self._on_due = on_due
        self._recovered: deque[DueEntry] = deque()  # expired leases and stragglers (``sweep``)
        self._epochs: dict[int, int] = {}  # shard -> the epoch held: older claims are orphans
        self._sweep_now = asyncio.Event()
        self._live: list[Cursor] = []
        self._backlogs: list[Cursor] = []
        self._wake = asyncio.Event()

    # --- ownership ------------------------------------------------------------------------------

    def gain(self, epochs: Mapping[int, int]) -> None:
        """Start loading newly owned shards (with the epochs they were taken under): overdue jobs
        to the backlog, the window to the heap, a previous owner's claims to the recovery lane."""
        if not epochs:
            return
        shards = set(epochs)
        self._epochs.update(epochs)
        self._sweep_now.set()
        now = _at(self._clock())
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
        self._heap.retain(lambda entry: entry.shard not in lost)
        self._backlog.retain(lambda entry: entry.shard not in lost)
        self._recovered = deque(entry for entry in self._recovered if entry.shard not in lost)

    # --- intake ---------------------------------------------------------------------------------

    def covers(self, shard: int, run_at_s: float) -> bool:
        """Whether a job stored now must be pushed here because no load will pick it up."""
        return any(shard in cursor.shards and run_at_s <= cursor.target_s for cursor in self._live)

    def offer(self, entries: Iterable[DueEntry]) -> None:
        """Push freshly stored jobs that fall inside the loaded window."""
        earliest = False
        for entry in entries:
            if self.covers(entry.shard, entry.run_at_s):
                earliest = self._heap.push(entry) or earliest
        if earliest:
            self._on_due()
        if len(self._heap) > self._heap_cap * TRIM_SLACK:
            self._trim()

    def put_back(self, entries: Iterable[DueEntry]) -> None:
        """Return entries whose firing failed; they fire again as soon as they can."""
        self._heap.extend(entries)
        self._on_due()

    def rewind(self, back_s: float) -> None:
        """Load the window again from ``back_s`` ago: jobs may have entered it unannounced (due
        notices missed while their connection was down)."""
        back = (_at(self._clock() - back_s), MIN_ID)
        for cursor in self._live:
            cursor.position = min(cursor.position, back)
        self._wake.set()

    def heap_drained(self) -> None:
        """Called by the firing loop after every pop: load again only if a capped lane has room.

        A lane is capped while a cursor has not reached its target; waking the loader on every
        pop otherwise would run a load query per firing batch for nothing.
        """
        heap_starved = len(self._heap) < self._heap_cap // 2 and any(
            cursor.position[0] < cursor.target for cursor in self._live
        )
        backlog_starved = bool(self._backlogs) and len(self._backlog) < self._backlog_cap // 2
        if heap_starved or backlog_starved or self._lagging():
            self._wake.set()

    def _lagging(self) -> bool:
        """The live lane holds jobs later than ``live_lag_s`` (checked twice per lag at most)."""
        now_s = self._clock()
        if now_s - self._demoted_at_s < self._live_lag_s / 2:
            return False
        earliest = self._heap.next_due_s()
        return earliest is not None and earliest < now_s - self._live_lag_s

    # --- loading --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Load, then sleep until the window needs extending; forever."""
        failures = 0
        while True:
            try:
                await self.fill()
                failures = 0
                timeout = min(self._lookahead_s / 4, self._lease_sweep_s)
            except errors.StoreUnavailable as exc:
                failures += 1
                timeout = min(0.25 * 2**failures, 5.0)
                logger.warning("loader: %s; retrying in %.1fs", exc, timeout)
            self._wake.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def fill(self) -> None:
        if self._lagging():
            self._demote()
        horizon = _at(self._clock() + self._lookahead_s)
        for cursor in list(self._live):
            if cursor.target < horizon:
                cursor.aim(horizon)
            await self._load(cursor, cursor.target, self._heap_cap - len(self._heap), live=True)
        self._merge_live()
        for cursor in list(self._backlogs):
            if len(self._backlog) >= self._backlog_cap // 2:
                break
            assert cursor.end is not None
            done = await self._load(
                cursor, cursor.end, self._backlog_cap - len(self._backlog), live=False
            )
            if done:
                self._backlogs.remove(cursor)

    async def _load(self, cursor: Cursor, until: datetime, budget: int, *, live: bool) -> bool:
        """Advance a cursor towards ``until`` within ``budget`` entries; True when it got there."""
        while budget > 0:
            limit = min(self._load_batch, budget)
            entries, last = await self._store.load_due(
                sorted(cursor.shards), after=cursor.position, until=until, limit=limit
            )
            if live:
                self._heap.extend(entries)
            else:
                self._backlog.extend(entries)
            if entries:
                self._on_due()
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
        now_s = self._clock()
        self._demoted_at_s = now_s
        if not self._live:  # no cursor to hand the range over to: the entries stay
            return
        cutoff_s = now_s - self._live_lag_s
        before = len(self._heap)
        earliest = self._heap.evict_before(cutoff_s)
        if earliest is None:
            return
        cutoff = _at(cutoff_s)
        # Everything of the live shards from the earliest evicted entry to the cutoff is loaded
        # again by a backlog cursor (a millisecond early: float rounding may only duplicate).
        start = min((_at(earliest - 0.001), MIN_ID), *(cursor.position for cursor in self._live))
        shards = set().union(*(cursor.shards for cursor in self._live))
        self._backlogs.append(Cursor(shards, start, cutoff, end=cutoff))
        for cursor in self._live:
            cursor.position = max(cursor.position, (cutoff, MAX_ID))
            if cursor.target < cutoff:
                cursor.aim(cutoff)
        self.demoted += before - len(self._heap)
        logger.warning(
            "firing is %.1fs behind: %d jobs moved to the catch-up lane",
            now_s - earliest,
            before - len(self._heap),
            extra={"action": "catch-up"},
        )

    def _trim(self) -> None:
        kept = self._heap.trim(self._heap_cap)
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
        catch-up takes, recovery is never behind it), and at once when shards are taken."""
        failures = 0
        while True:
            self._sweep_now.clear()
            try:
                await self.sweep()
                failures = 0
                delay = self._lease_sweep_s
            except errors.StoreUnavailable as exc:
                failures += 1
                delay = min(0.25 * 2**failures, 5.0)
                logger.warning("sweep: %s; retrying in %.1fs", exc, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._sweep_now.wait()

    def take_recovered(self, limit: int) -> list[DueEntry]:
        """Up to ``limit`` entries of the recovery lane, oldest finds first."""
        count = min(limit, len(self._recovered))
        return [self._recovered.popleft() for _ in range(count)]

    async def sweep(self) -> int:
        """Hand back what no load will: claims never confirmed (a crash, an outage) once their
        lease ran out, and, when no backlog is draining, scheduled jobs overdue past the grace.

        They go to the recovery lane, which firing serves before the backlog and outside the
        catch-up pace, so a long catch-up never holds them up. (While a backlog drains, the
        overdue stragglers are left to it: it walks every scheduled job of its range.)"""
        shards = sorted(set().union(*(cursor.shards for cursor in self._live)))
        if not shards:
            return 0
        entries = await self._store.expired_leases(shards, self._load_batch)
        if entries:
            logger.info("re-firing %d jobs whose lease expired", len(entries))
        orphans = await self._store.orphaned_claims(self._epochs, self._load_batch)
        if orphans:
            logger.info(
                "re-firing %d jobs claimed by a previous owner of their shard (it died or lost "
                "the shard: its epoch is past)",
                len(orphans),
                extra={"action": "recover"},
            )
        entries += orphans
        # Only when nothing in memory is that late itself: otherwise firing is merely behind.
        earliest = self._heap.next_due_s()
        lagging = earliest is not None and earliest < self._clock() - self._sweep_grace_s
        if not self._backlogs and not len(self._backlog) and not lagging:
            stragglers = await self._store.overdue_stragglers(
                shards, self._sweep_grace_s, self._load_batch
            )
            if stragglers:
                logger.warning("firing %d overdue jobs no load had picked up", len(stragglers))
            entries += stragglers
        known = {entry.id for entry in self._recovered}
        # A claim may be both orphaned and past its lease: taken once.
        fresh = list({e.id: e for e in entries if e.id not in known}.values())
        if fresh:
            self._recovered.extend(fresh)
            self._on_due()
        return len(fresh)

    @property
    def horizon(self) -> datetime | None:
        return self._live[0].position[0] if self._live else None
