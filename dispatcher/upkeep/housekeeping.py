"""Housekeeping: deletes jobs finished longer ago than the retention, in small batches, then the
event batches that name only jobs gone and the claims with nothing in flight under them, and
refreshes the job counts that ``/metrics``, ``/v1/stats`` and the console show.

Deleting in batches of ``batch`` rows (``FOR UPDATE SKIP LOCKED``, one short transaction each)
keeps locks short and lets autovacuum reuse the space, so the table stays bounded without a long
``DELETE``. Jobs and event batches are each walked in id order (the order made) from a cursor this
node keeps (``Walk``), up to the first made within the retention: a job not finished yet, or a
batch that still names a job (a pending job's notes, a requeued job's earlier rounds), is passed
over, and looked at again when the walk starts over: once an hour (``REVISIT_S``), or once a
retention period when that is shorter.

Counting: every ``stats_interval_s`` each node tries to count, but one node at a time does (an
advisory lock; the others keep the previous counts), and it stores the counts in ``job_counts``,
which every node then reads: a few rows, whatever the size of the table. Each state is counted
on its own, from its range of an index (``history.COUNT_STATE``; dispatched and succeeded jobs,
which no index names, by reading the table, in one read when both are due), and again only
once its last count is
older than ``COUNT_SPACING`` times what that count took: the states with few jobs (those in
flight, a modest backlog) are recounted every round, while the finished jobs, the bulk of the
table, are recounted less often as they grow (``counted_at_by_state`` in ``/v1/stats`` says
when). Each state keeps its top routing keys and sums the rest, and the snapshot names at most
``routing_keys`` keys in all, so ``/v1/stats`` stays small whatever producers send.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from dispatcher import metrics, models, supervision
from dispatcher.store.history import HistoryStore, StateCount

logger = logging.getLogger(__name__)

# A state is recounted once its count is older than this many times what the count took: its
# count takes at most a fiftieth of the time between two, at any size of the table.
COUNT_SPACING = 50.0
# How often the walks of jobs and of event batches start over (a retention shorter than this: as
# often as that): the longest a job or batch passed over waits to be looked at again.
REVISIT_S = 3600.0
# A claim is looked at for deletion once made this long ago: most of its jobs are confirmed or
# released by then, so it is read once, not every round while they are in flight.
CLAIM_AGE_S = 5.0
CLAIMS_PER_DELETE = 1000
_FIRST_JOB = uuid.UUID(int=0)
Cursor = TypeVar("Cursor")


class Walk(Generic[Cursor]):
    """A cursor through a table in id order: the last id looked at, back to the start once the
    walk caught up with the retention and began longer ago than ``REVISIT_S`` (or the
    retention, when that is shorter), so that a row passed over is looked at again."""

    def __init__(self, start: Cursor) -> None:
        self._start = start
        self.after = start
        self._started = time.monotonic()

    def advance(self, last: Cursor | None, retention_s: float) -> bool:
        """Move past ``last``; False once caught up (``last`` None): the round's walk ends."""
        if last is not None:
            self.after = last
            return True
        if time.monotonic() - self._started >= min(retention_s, REVISIT_S):
            self.after = self._start
            self._started = time.monotonic()
        return False


STATES = [state.value for state in models.JobState]


@dataclass(frozen=True, slots=True, kw_only=True)
class Count:
    state: str
    routing_key: str
    jobs: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The last counts: ``counts`` per state of the top routing keys, ``other`` per state of every
    other key, the totals per state, and when each state was counted (empty before the first)."""

    counts: list[Count] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    by_state: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    counted_at: dict[str, datetime] = field(default_factory=dict)


def summarise(states: Sequence[StateCount], routing_keys: int) -> Snapshot:
    """The ``routing_keys`` keys with the most jobs over every state, by name; the rest of each
    state summed in ``other`` (a key past a state's own top is already in its ``other_jobs``)."""
    totals: Tally[str] = Tally()
    for state in states:
        totals.update(state.by_key)
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    named = {key for key, _ in ranked[:routing_keys]}
    counts: list[Count] = []
    other: dict[str, int] = {}
    by_state = dict.fromkeys(STATES, 0)
    for state in states:
        rest = state.other_jobs
        for key, jobs in state.by_key.items():
            if key in named:
                counts.append(Count(state=state.state, routing_key=key, jobs=jobs))
            else:
                rest += jobs
        other[state.state] = rest
        by_state[state.state] = sum(state.by_key.values()) + state.other_jobs
    return Snapshot(
        counts=counts,
        other=other,
        by_state=by_state,
        counted_at={state.state: state.counted_at for state in states},
    )


class Housekeeper:
    def __init__(
        self,
        store: HistoryStore,
        metrics: metrics.Metrics,
        *,
        retention_s: float,
        batch: int,
        stats_interval_s: float,
        routing_keys: int = 50,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._retention_s = retention_s
        self._batch = batch
        self._interval_s = stats_interval_s
        self._routing_keys = routing_keys
        self.snapshot = Snapshot()
        self._jobs = Walk(_FIRST_JOB)  # the jobs' cursor
        self._batches = Walk(0)  # the event batches'

    async def run(self) -> None:
        rounds = supervision.Rounds(
            "purge and counts",
            self._interval_s,
            on_paused=lambda exc: logger.warning("housekeeping skipped: %s", exc),
        )
        await rounds.run(self._round)

    async def _round(self) -> None:
        await self.purge()
        await self.purge_events()
        await self.purge_claims()
        await self.refresh()

    async def purge(self) -> int:
        """Delete the jobs finished before the retention, a batch at a time from the cursor;
        returns how many."""
        total = 0
        while True:
            last, deleted = await self._store.delete_finished(
                older_than_s=self._retention_s, batch=self._batch, after=self._jobs.after
            )
            total += deleted
            self._metrics.retention_deleted.inc(deleted)
            if not self._jobs.advance(last, self._retention_s):
                return total
            await asyncio.sleep(0)  # let the API and firing in between batches

    async def purge_events(self) -> int:
        """Delete the event batches recorded before the retention whose jobs are all gone, a
        batch at a time from the cursor; returns how many."""
        total = 0
        while True:
            last, deleted = await self._store.delete_spent_batches(
                older_than_s=self._retention_s, batch=self._batch, after=self._batches.after
            )
            total += deleted
            if not self._batches.advance(last, self._retention_s):
                return total
            await asyncio.sleep(0)

    async def purge_claims(self) -> int:
        """Delete the claims with nothing in flight under them; returns how many."""
        total = 0
        while True:
            deleted = await self._store.delete_spent_claims(
                older_than_s=CLAIM_AGE_S, batch=CLAIMS_PER_DELETE
            )
            total += deleted
            if deleted < CLAIMS_PER_DELETE:
                return total
            await asyncio.sleep(0)

    async def refresh(self) -> list[str]:
        """Count what is due if no other node is counting, then take the stored counts; returns
        the states this node counted."""
        # Half an interval: a node's rounds are an interval apart, so each recounts what it may.
        counted = await self._store.recount(
            STATES,
            min_age_s=self._interval_s / 2,
            spacing=COUNT_SPACING,
            top=self._routing_keys,
        )
        self.snapshot = summarise(await self._store.counts(), self._routing_keys)
        for state, jobs in self.snapshot.by_state.items():
            self._metrics.jobs_by_state.labels(state=state).set(jobs)
        self._metrics.scheduled_backlog.set(self.snapshot.by_state[models.JobState.SCHEDULED.value])
        return counted
