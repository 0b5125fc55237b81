"""The dependents follow-up: finishes the releases and cancellations that the database's trigger
deferred (``sql/0010_flood_bounds.sql``).

The trigger follows a finishing prerequisite's dependents in the transaction of its change only
while that transaction has followed at most 1000; beyond, it queues the prerequisite. Every node
runs this loop: it works the queue in batches of ``batch`` dependents, one short transaction each
(``FOR UPDATE SKIP LOCKED`` on the queue, so nodes share it), released jobs announced with due
notices. So a prerequisite with 100 000 dependents costs its consumer's event one queued row, and
the rest of the event recording (everyone's) does not wait for it. A cancelled dependent's own
dependents are followed by the trigger its cancel fires, inline or queued in turn.
"""

from __future__ import annotations

import logging

from dispatcher import metrics, supervision
from dispatcher.store import dependencies
from dispatcher.store.db import Database

logger = logging.getLogger(__name__)
_LOG = {"action": "dependents"}


class DependentsFollower:
    def __init__(
        self, db: Database, metrics: metrics.Metrics, *, batch: int, poll_s: float
    ) -> None:
        self._db = db
        self._metrics = metrics
        self._batch = batch
        # Deadlocks are StoreUnavailable too: the batch is redone at the next round.
        self._rounds = supervision.Rounds(
            "follow-up",
            poll_s,
            on_paused=lambda exc: logger.warning(
                "dependents: follow-up paused: %s", exc, extra=_LOG
            ),
        )

    def stop(self) -> None:
        self._rounds.stop()

    async def run(self) -> None:
        await self._rounds.run(self._round)

    async def _round(self) -> None:
        await self.drain()

    async def drain(self) -> int:
        """Work the queue until it is empty (or ``stop``); returns how many dependents were
        released or cancelled."""
        total = 0
        while not self._rounds.stopping:
            followed = await dependencies.follow_deferred(self._db, batch=self._batch)
            if followed is None:
                break
            total += followed.released + followed.cancelled
            self._metrics.dependents_followed.labels(outcome="released").inc(followed.released)
            self._metrics.dependents_followed.labels(outcome="cancelled").inc(followed.cancelled)
            if followed.done:
                logger.info(
                    "dependents of %s followed",
                    followed.prerequisite_id,
                    extra={**_LOG, "job_id": str(followed.prerequisite_id)},
                )
        return total
