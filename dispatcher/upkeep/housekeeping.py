"""Housekeeping: deletes jobs finished longer ago than the retention, in small batches, then the
event batches that name only jobs gone, and refreshes the job counts that ``/metrics``,
``/v1/stats`` and the console show.

Deleting in batches of ``batch`` rows (``FOR UPDATE SKIP LOCKED``, one short transaction each)
keeps locks short and lets autovacuum reuse the space, so the table stays bounded without a long
``DELETE``. Event batches are walked in id order (the order recorded) from a cursor this node
keeps: a batch that still names a job (a pending job's notes, a requeued job's earlier rounds)
is passed over, and looked at again when the walk starts over: once an hour (``REVISIT_S``), or
once a retention period when that is shorter.

Counting: every ``stats_interval_s`` each node tries to count, but one node at a time does (an
advisory lock; the others keep the previous counts), and it stores the counts in ``job_counts``,
which every node then reads: a few rows, whatever the size of the table. Each state is counted
on its own, from its range of the ``jobs_state`` index, and again only once its last count is
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
from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from dispatcher import metrics, models, supervision
from dispatcher.store.history import HistoryStore, StateCount

logger = logging.getLogger(__name__)

# A state is recounted once its count is older than this many times what the count took: its
# count takes at most a fiftieth of the time between two, at any size of the table.
COUNT_SPACING = 50.0
# How often the walk of event batches starts over (a retention shorter than this: as often as
# that): the longest a batch kept for a job still here waits to be looked at again.
REVISIT_S = 3600.0
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
        self._batches_after = 0  # the event batches' cursor: the last id looked at
        self._walk_started = time.monotonic()

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
        await self.refresh()

    async def purge(self) -> int:
        """Delete every job finished before the retention, a batch at a time; returns how many."""
        total = 0
        while True:
            deleted = await self._store.delete_finished(
                older_than_s=self._retention_s, batch=self._batch
            )
            total += deleted
            self._metrics.retention_deleted.inc(deleted)
            if deleted < self._batch:
                return total
            await asyncio.sleep(0)  # let the API and firing in between batches

    async def purge_events(self) -> int:
        """Delete the event batches recorded before the retention whose jobs are all gone, a
        batch at a time from the cursor; returns how many."""
        total = 0
        while True:
            last, deleted = await self._store.delete_spent_batches(
                older_than_s=self._retention_s, batch=self._batch, after=self._batches_after
            )
            total += deleted
            if last is None:  # caught up with the retention
                revisit_s = min(self._retention_s, REVISIT_S)
                if time.monotonic() - self._walk_started >= revisit_s:
                    self._batches_after = 0
                    self._walk_started = time.monotonic()
                return total
            self._batches_after = last
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
