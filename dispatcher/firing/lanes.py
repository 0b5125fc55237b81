"""The three lanes of due jobs and the rule that makes a firing batch of them. Pure: no I/O; the
time is passed in and the catch-up pace injected.

- the *live* lane (``heap.DueHeap``): the jobs falling due inside the loaded window;
- the *backlog* lane (``heap.Backlog``): overdue jobs being caught up (found at start, at a
  takeover, or moved out of a live lane that fell behind), drained at the catch-up pace;
- the *recovery* lane: expired leases, a previous owner's claims and stragglers found by the
  sweep, served first and unpaced.

The loader fills the lanes and the firer takes from them; the node builds one ``Lanes`` and hands
it to both. The interface::

    Lanes(*, catchup_share: float, pace: pacing.Pace)
    # filled by the loader
    offer(entries: Iterable[DueEntry]) -> None        # fresh jobs into the live lane
    fill_live(entries: Sequence[DueEntry]) -> None    # a load of the window
    fill_backlog(entries: Sequence[DueEntry]) -> None # a load of overdue jobs
    recover(entries: Iterable[DueEntry]) -> int       # the sweep's finds, those new to the lane
    put_back(entries: Iterable[DueEntry]) -> None     # jobs whose firing failed: due again
    retain(keep: Callable[[DueEntry], bool]) -> None  # shards lost: every lane drops theirs
    demote(cutoff_s: float) -> Demoted | None         # the live lane's late entries dropped
    trim_live(cap: int) -> DueEntry | None            # the live lane cut back to its cap
    when_taken(callback: Callable[[], None]) -> None  # the loader hears of every batch taken
    # taken by the firer
    take(now_s: float, limit: int, *, live_only: bool) -> list[DueEntry]
    next_wake_s(now_s: float, *, live_only: bool) -> float | None
    due: asyncio.Event                                # set when something fell due sooner
    # read by both, and by the metrics
    live_count, backlog_count, recovery_count, demoted: int; next_live_s() -> float | None

A batch (``take``): the recovery lane first, up to a quarter of it, the rest live jobs due now;
otherwise live jobs due now with a share (``catchup_share``) kept for the backlog, as much of it
as the pace allows, and the whole batch for the backlog when few live jobs are due. The live
worker (``live_only``) takes live jobs alone. A batch of live jobs alone claims ahead: once the
next live job is ``CLAIM_LEAD_S`` from due, those due in the next ``CLAIM_AHEAD_S`` join it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from dispatcher.firing import heap, pacing
from dispatcher.models import DueEntry

# Take a live batch this long before the earliest job is due: a claim's round trip, with room
# under load.
CLAIM_LEAD_S = 0.010
# With it, take what falls due this much later. Claims are leased (seconds) and fenced, and each
# job is published at its due time, so holding them this long changes no guarantee.
CLAIM_AHEAD_S = 0.050
RECOVERY_SHARE = 4  # the recovery lane takes up to 1/RECOVERY_SHARE of a batch


@dataclass(frozen=True, slots=True)
class Demoted:
    """What ``demote`` dropped from the live lane: the earliest entry's time and how many."""

    earliest_s: float
    count: int


def _nothing() -> None:
    return None


class Lanes:
    def __init__(self, *, catchup_share: float, pace: pacing.Pace) -> None:
        self._live = heap.DueHeap()
        self._backlog = heap.Backlog()
        self._recovery: deque[DueEntry] = deque()
        self._catchup_share = catchup_share
        self._pace = pace
        self._on_taken: Callable[[], None] = _nothing
        self.due = asyncio.Event()  # no loop is bound until a task waits on it
        self.demoted = 0  # entries dropped from the live lane for the backlog lane, ever

    @property
    def live_count(self) -> int:
        return len(self._live)

    @property
    def backlog_count(self) -> int:
        return len(self._backlog)

    @property
    def recovery_count(self) -> int:
        return len(self._recovery)

    def next_live_s(self) -> float | None:
        """When the earliest live entry is due."""
        return self._live.next_due_s()

    # --- filled by the loader -------------------------------------------------------------------

    def offer(self, entries: Iterable[DueEntry]) -> None:
        """Fresh jobs into the live lane; the firer is woken only by a new earliest one."""
        earliest = False
        for entry in entries:
            earliest = self._live.push(entry) or earliest
        if earliest:
            self.due.set()

    def fill_live(self, entries: Sequence[DueEntry]) -> None:
        self._live.extend(entries)
        if entries:
            self.due.set()

    def fill_backlog(self, entries: Sequence[DueEntry]) -> None:
        self._backlog.extend(entries)
        if entries:
            self.due.set()

    def recover(self, entries: Iterable[DueEntry]) -> int:
        """Add what the sweep found and the recovery lane does not hold yet (a claim may be both
        orphaned and past its lease: taken once); returns how many were new."""
        known = {entry.id for entry in self._recovery}
        fresh = list({e.id: e for e in entries if e.id not in known}.values())
        if fresh:
            self._recovery.extend(fresh)
            self.due.set()
        return len(fresh)

    def put_back(self, entries: Iterable[DueEntry]) -> None:
        """Entries whose firing failed, into the live lane: they fire again as soon as they can."""
        self._live.extend(entries)
        self.due.set()

    def retain(self, keep: Callable[[DueEntry], bool]) -> None:
        """Drop, from every lane, the entries ``keep`` rejects (their shards were lost)."""
        self._live.retain(keep)
        self._backlog.retain(keep)
        self._recovery = deque(entry for entry in self._recovery if keep(entry))

    def demote(self, cutoff_s: float) -> Demoted | None:
        """Drop the live entries due before ``cutoff_s`` (the loader loads their range again into
        the backlog lane); None when there were none."""
        before = len(self._live)
        earliest_s = self._live.evict_before(cutoff_s)
        if earliest_s is None:
            return None
        count = before - len(self._live)
        self.demoted += count
        return Demoted(earliest_s, count)

    def trim_live(self, cap: int) -> DueEntry | None:
        """Keep the ``cap`` earliest live entries; the latest one kept when any were dropped."""
        return self._live.trim(cap)

    def when_taken(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after every batch taken (the loader's cue to check for room)."""
        self._on_taken = callback

    # --- taken by the firer ---------------------------------------------------------------------

    def take(self, now_s: float, limit: int, *, live_only: bool) -> list[DueEntry]:
        """Up to ``limit`` entries to fire at ``now_s`` (see the module's docstring)."""
        batch = self._take_live(now_s, limit) if live_only else self._take_shared(now_s, limit)
        if batch:
            self._on_taken()
        return batch

    def next_wake_s(self, now_s: float, *, live_only: bool) -> float | None:
        """How long a worker that took nothing sleeps (None: until ``due`` is set): see
        ``wake_in_s``, and no longer than the pace holds the backlog back."""
        paced_backlog = bool(len(self._backlog)) and not live_only
        wake_s = wake_in_s(self._live.next_due_s(), now_s, claims_ahead=not paced_backlog)
        if paced_backlog:
            paced_s = self._pace.wait_s(now_s, len(self._backlog))
            wake_s = paced_s if wake_s is None else min(wake_s, paced_s)
        return wake_s

    def _take_shared(self, now_s: float, limit: int) -> list[DueEntry]:
        # Recovered claims and stragglers first, unpaced, in a share of the batch: their own
        # budget, whatever the backlog and its pace.
        recovered = [
            self._recovery.popleft()
            for _ in range(min(max(1, limit // RECOVERY_SHARE), len(self._recovery)))
        ]
        if recovered:
            return recovered + self._live.pop_due(now_s, limit - len(recovered))
        waiting = len(self._backlog)
        if not waiting:
            return self._take_live(now_s, limit)
        share = min(waiting, max(1, int(limit * self._catchup_share)), limit - 1)
        overdue = self._pace.take(now_s, share)
        entries = self._live.pop_due(now_s, limit - overdue)
        room = min(limit - len(entries), waiting) - overdue
        if room > 0:  # few live jobs due: the backlog may have the rest of the batch
            overdue += self._pace.take(now_s, room)
        entries.extend(self._backlog.pop(overdue))
        return entries

    def _take_live(self, now_s: float, limit: int) -> list[DueEntry]:
        """The live jobs due now and, once the next is within the claim's lead, those falling due
        in the next ``CLAIM_AHEAD_S``. A batch with overdue jobs takes none ahead: its worker
        would hold the backlog while it waits."""
        entries = self._live.pop_due(now_s, limit)
        next_due_s = self._live.next_due_s()
        if len(entries) < limit and next_due_s is not None and next_due_s <= now_s + CLAIM_LEAD_S:
            entries.extend(self._live.pop_due(now_s + CLAIM_AHEAD_S, limit - len(entries)))
        return entries


def wake_in_s(next_due_s: float | None, now_s: float, *, claims_ahead: bool) -> float | None:
    """How long a worker with nothing to take sleeps (None: until woken): until the next live job
    is ``CLAIM_LEAD_S`` from due when its batch would claim ahead; until the job is due when the
    worker has overdue jobs to take, which claim nothing ahead (woken sooner, it would find
    nothing to take and wake again at once until then)."""
    if next_due_s is None:
        return None
    return max(0.0, next_due_s - (CLAIM_LEAD_S if claims_ahead else 0.0) - now_s)
