"""Housekeeping: deletes jobs finished longer ago than the retention, in small batches, and
refreshes the job counts that ``/metrics`` and the console show.

Deleting in batches of ``batch`` rows (``FOR UPDATE SKIP LOCKED``, one short transaction each)
keeps locks short and lets autovacuum reuse the space, so the table stays bounded without a long
``DELETE``. Counting is a full scan, so it runs here every ``stats_interval_s`` and the API serves
the last answer instead of scanning per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dispatcher import errors, metrics, models
from dispatcher.store.history import Count, HistoryStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The last counts, and when they were taken (POSIX seconds; 0 before the first)."""

    counts: list[Count] = field(default_factory=list)
    taken_at_s: float = 0.0


class Housekeeper:
    def __init__(
        self,
        store: HistoryStore,
        metrics: metrics.Metrics,
        *,
        retention_s: float,
        batch: int,
        stats_interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._retention_s = retention_s
        self._batch = batch
        self._interval_s = stats_interval_s
        self._clock = clock
        self.snapshot = Snapshot()

    async def run(self) -> None:
        while True:
            try:
                await self.purge()
                await self.refresh()
            except errors.StoreUnavailable as exc:
                logger.warning("housekeeping skipped: %s", exc)
            await asyncio.sleep(self._interval_s)

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

    async def refresh(self) -> None:
        counts = await self._store.counts()
        self.snapshot = Snapshot(counts, self._clock())
        by_state = dict.fromkeys(models.JobState, 0)
        for count in counts:
            by_state[models.JobState(count.state)] += count.jobs
        for state, jobs in by_state.items():
            self._metrics.jobs_by_state.labels(state=state.value).set(jobs)
        self._metrics.scheduled_backlog.set(by_state[models.JobState.SCHEDULED])
