"""The materialiser: every node, every ``poll_s``, turns the occurrences of due schedules into
ordinary jobs (through the intake, so they enter the heap like any submission) a little ahead of
their time, then advances each schedule.

Jobs are stored before the schedule advances, in that order: a crash in between leaves
``next_at`` where it was, and the next pass (here or on another node) inserts the same jobs again,
which their idempotency keys (``schedule:<name>:<occurrence>``) turn into no-ops. Nodes share the
work through row locks: a pass locks the schedules it handles (``FOR UPDATE SKIP LOCKED``) until
it has advanced them, and skips those another node holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from dispatcher import errors, models
from dispatcher.intake import Intake
from dispatcher.schedules import occurrences
from dispatcher.schedules.model import Schedule
from dispatcher.store.schedules import Advance, ScheduleStore

logger = logging.getLogger(__name__)

SCHEDULES_PER_PASS = 100
SUBMIT_BATCH = 1000  # jobs per intake call: a catch-up of many schedules is not one statement


def _now() -> datetime:
    return datetime.now(UTC)


class Materialiser:
    def __init__(
        self,
        store: ScheduleStore,
        intake: Intake,
        *,
        ahead_s: float,
        poll_s: float,
        per_schedule: int,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self._store = store
        self._intake = intake
        self._ahead_s = ahead_s
        self._poll_s = poll_s
        self._per_schedule = per_schedule
        self._clock = clock
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = await self.run_pass() == SCHEDULES_PER_PASS
            except errors.StoreUnavailable as exc:
                logger.warning("schedules: pass skipped: %s", exc, extra={"action": "schedules"})
                busy = False
            if not busy:  # after a full batch more may be due: go on at once
                try:
                    async with asyncio.timeout(self._poll_s):
                        await self._stop.wait()
                except TimeoutError:
                    pass

    async def run_pass(self) -> int:
        """One pass: returns how many schedules it handled."""
        now = self._clock()
        horizon = now + timedelta(seconds=self._ahead_s)
        async with self._store.due(horizon, SCHEDULES_PER_PASS) as (schedules, advance):
            if not schedules:
                return 0
            specs: dict[str | None, list[models.JobSpec]] = defaultdict(list)
            advances = []
            for schedule in schedules:
                try:
                    jobs, step = self._plan(schedule, now)
                except (ValueError, KeyError):  # its zone left the tz database, say
                    # One broken schedule must not stop the others, nor the node: it stays put.
                    logger.exception(
                        "schedule %s cannot be planned",
                        schedule.name,
                        extra={"action": "schedules"},
                    )
                    continue
                specs[schedule.namespace].extend(jobs)
                advances.append(step)
            for namespace, jobs in specs.items():
                for first in range(0, len(jobs), SUBMIT_BATCH):
                    batch = jobs[first : first + SUBMIT_BATCH]
                    await self._intake.submit(batch, namespace=namespace)
            await advance(advances)  # only once every job is stored
        return len(schedules)

    def _plan(self, schedule: Schedule, now: datetime) -> tuple[list[models.JobSpec], Advance]:
        assert schedule.next_at is not None  # only active schedules are due
        plan = occurrences.plan(
            schedule.spec.timing,
            schedule.next_at,
            now=now,
            ahead_s=self._ahead_s,
            grace_s=schedule.spec.grace_s,
            missed=schedule.spec.missed,
            limit=self._per_schedule,
        )
        if plan.skipped_missed:
            logger.info(
                "schedule %s: missed occurrences before %s not fired (missed=%s)",
                schedule.name,
                occurrences.rfc3339(plan.fire[0] if plan.fire else now),
                schedule.spec.missed.value,
                extra={"action": "schedules"},
            )
        last = plan.fire[-1] if plan.fire else None
        return [schedule.job(at) for at in plan.fire], Advance(schedule.id, plan.next_at, last)
