"""Dispatch marks: confirmed jobs are marked ``dispatched`` in shared round trips.

A firing worker hands its confirmed ids over and takes its next batch at once instead of waiting
for an UPDATE; one task marks whatever has gathered meanwhile in one statement. A mark that cannot
be written (PostgreSQL down) is retried with backoff: the job stays ``dispatching`` meanwhile, and
if the process dies first its lease runs out and it is published again (at-least-once). The marks
still to write would be lost to a restart, so the task retries inside and reports itself
degraded to its supervisor (``/readyz`` shows it) until a mark is written again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable

from dispatcher import errors, supervision

logger = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0
MAX_BATCH = 5000

Mark = Callable[[list[uuid.UUID]], Awaitable[None]]


class DispatchMarks:
    def __init__(self, mark: Mark) -> None:
        self._mark = mark
        self._pending: list[uuid.UUID] = []
        self._work = asyncio.Event()
        self._closing = False
        self.flushes = 0  # round trips made, for tests

    def add(self, ids: Iterable[uuid.UUID]) -> None:
        self._pending.extend(ids)
        self._work.set()

    def close(self) -> None:
        """``run`` returns once everything handed over so far is marked (or given up on)."""
        self._closing = True
        self._work.set()

    async def run(self) -> None:
        backoff = supervision.Backoff(first_s=FIRST_BACKOFF_S, max_s=MAX_BACKOFF_S)
        while True:
            await self._work.wait()
            if not self._pending:
                self._work.clear()
                if self._closing:
                    return
                continue
            batch = self._pending[:MAX_BATCH]
            try:
                await self._mark_isolated(batch)
            except errors.StoreUnavailable as exc:
                delay = backoff.next()
                supervision.report_degraded("marks", exc)
                if self._closing and backoff.failures > 3:
                    logger.error("%d confirmed jobs stay leased; they will fire again", len(batch))
                    del self._pending[: len(batch)]
                    continue
                logger.warning("marking %d jobs dispatched failed: %s", len(batch), exc)
                await asyncio.sleep(delay)
                continue
            if backoff.failures:
                backoff.reset()
                supervision.report_recovered("marks")
            self.flushes += 1
            del self._pending[: len(batch)]

    async def _mark_isolated(self, batch: list[uuid.UUID]) -> None:
        """Mark; when the statement fails for another reason than the database being away, the
        batch is halved until the jobs it fails on are found, and those are given up on (logged:
        their lease runs out and they fire again) so that one cannot hold up every other mark."""
        try:
            await self._mark(batch)
        except errors.StoreUnavailable:
            raise
        except Exception:
            if len(batch) == 1:
                logger.exception("job %s cannot be marked dispatched", batch[0])
                return
            middle = len(batch) // 2
            await self._mark_isolated(batch[:middle])
            await self._mark_isolated(batch[middle:])
