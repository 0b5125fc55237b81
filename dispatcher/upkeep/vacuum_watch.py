"""The loop that looks, every interval, at what holds vacuum back (``vacuum_horizon``), and
shows it in ``/metrics`` (and, through the horizon, in ``/readyz``). A failed look (PostgreSQL
away) raises: the supervisor runs the loop again, and the horizon keeps what it had seen."""

from __future__ import annotations

import logging
import time

from dispatcher import metrics, supervision
from dispatcher.store.snapshots import SnapshotStore
from dispatcher.timing.kinds import Mono
from dispatcher.upkeep.vacuum_horizon import Horizon

logger = logging.getLogger(__name__)

# The holders read each look: the oldest xmins, the one that matters among them.
HOLDERS = 5


class VacuumWatch:
    def __init__(
        self,
        store: SnapshotStore,
        horizon: Horizon,
        node_metrics: metrics.Metrics,
        *,
        interval_s: float,
        mono: Mono = time.monotonic,
    ) -> None:
        self._store = store
        self.horizon = horizon
        self._metrics = node_metrics
        self._interval_s = interval_s
        self._mono = mono

    async def run(self) -> None:
        rounds = supervision.Rounds(
            "snapshots",
            self._interval_s,
            on_paused=lambda exc: logger.warning("vacuum watch: look skipped: %s", exc),
        )
        await rounds.run(self.look)

    async def look(self) -> None:
        was_held_back = self.horizon.held_back
        self.horizon.saw(await self._store.look(HOLDERS), self._mono())
        oldest = self.horizon.oldest
        self._metrics.oldest_snapshot.set(0.0 if oldest is None else oldest.age_s)
        self._metrics.vacuum_held_back.set(int(self.horizon.held_back))
        if self.horizon.held_back and not was_held_back and oldest is not None:
            logger.warning(
                "vacuum is held back: %s has held a snapshot for %.0f s (xmin age %d), past "
                "DISPATCHER_SNAPSHOT_WARN_S (%.0f s); dead rows pile up in the queue's indexes "
                "until it ends",
                f"{oldest.holder.kind} {oldest.holder.name}",
                oldest.age_s,
                oldest.holder.xmin_age,
                self.horizon.warn_after_s,
            )
        elif was_held_back and not self.horizon.held_back:
            logger.info("vacuum is no longer held back by an old snapshot")
