"""The materialiser: every node, every ``poll_s``, turns the occurrences of due schedules into
ordinary jobs (through the intake, so they enter the heap like any submission) a little ahead of
their time, then advances each schedule.

Jobs are stored before the schedule advances, in that order: a crash in between leaves
``next_at`` where it was, and the next pass (here or on another node) inserts the same jobs again,
which their idempotency keys (``schedule:<name>:<occurrence>``) turn into no-ops. Nodes share the
work through row locks: a pass locks the schedules it handles (``FOR UPDATE SKIP LOCKED``) until
it has advanced them, and skips those another node holds.

Fairness: a pass serves two lanes, each in a transaction of its own. The live lane holds the
schedules whose next occurrence is at most ``ahead_s`` in the past: each has a few occurrences to
make (at most ``2 * ahead_s`` worth), earliest first. The catch-up lane holds those further behind
(downtime, a ``start_at`` in the past under ``missed=all``): least recently served first, sharing
``per_schedule`` jobs per pass. So a backlog is worked off in short steps between which the live
lane is served again, and one busy schedule neither delays another's on-time occurrences (nor
gets them dropped as missed) nor holds the other backlogged schedules back.

A schedule that cannot be planned (whatever the error) or whose jobs PostgreSQL refuses is parked:
paused with the reason in its ``error`` (shown by the API, cleared by a resume), logged and
counted. It never fails the pass, is not retried every pass, and cannot stop the node.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher import errors, metrics, models, supervision
from dispatcher.intake.service import Intake
from dispatcher.recurring import occurrences
from dispatcher.recurring.model import Schedule
from dispatcher.store.schedules import Advance, Lane, Parked, ScheduleStore
from dispatcher.timing.kinds import NodeDate

logger = logging.getLogger(__name__)

SCHEDULES_PER_PASS = 100  # per lane
SUBMIT_BATCH = 1000  # jobs per intake call: a catch-up of many schedules is not one statement
CATCHUP_S = 3600.0  # Settings.schedule_catchup_window_s
REASON_CHARS = 500  # of an error kept as a parked schedule's reason


@dataclass(frozen=True, slots=True)
class _Planned:
    schedule: Schedule
    jobs: list[models.JobSpec]
    advance: Advance


def parked(schedule_id: int, what: str, exc: BaseException) -> Parked:
    return Parked(schedule_id, f"{what}: {type(exc).__name__}: {exc}"[:REASON_CHARS])


class Materialiser:
    """``per_schedule``: the most jobs a pass makes of one schedule; those behind share as many.
    ``catchup_s``: how far back occurrences are made up for (``occurrences.plan``)."""

    def __init__(
        self,
        store: ScheduleStore,
        intake: Intake,
        *,
        ahead_s: float,
        poll_s: float,
        per_schedule: int,
        catchup_s: float = CATCHUP_S,
        metrics: metrics.Metrics | None = None,
        now_dt: NodeDate,
    ) -> None:
        self._store = store
        self._intake = intake
        self._ahead = timedelta(seconds=ahead_s)
        self._per_schedule = per_schedule
        self._catchup_s = catchup_s
        self._metrics = metrics
        self._now_dt = now_dt
        self._rounds = supervision.Rounds(
            "passes",
            poll_s,
            on_paused=lambda exc: logger.warning(
                "schedules: pass skipped: %s", exc, extra={"action": "schedules"}
            ),
        )

    def stop(self) -> None:
        self._rounds.stop()

    async def run(self) -> None:
        await self._rounds.run(self._round)

    async def _round(self) -> bool:
        """Busy (go on at once) after a full live lane or a catch-up step: more may be due."""
        live, behind = await self._pass()
        return live == SCHEDULES_PER_PASS or behind > 0

    async def run_pass(self) -> int:
        """One pass (both lanes): returns how many schedules it handled."""
        live, behind = await self._pass()
        return live + behind

    async def _pass(self) -> tuple[int, int]:
        now = self._now_dt()
        behind_before = now - self._ahead
        async with self._store.live(behind_before, now + self._ahead, SCHEDULES_PER_PASS) as lane:
            live = await self._serve(lane, now, self._per_schedule)
        now = self._now_dt()
        async with self._store.behind(now - self._ahead, SCHEDULES_PER_PASS) as lane:
            share = max(1, self._per_schedule // max(1, len(lane.schedules)))
            behind = await self._serve(lane, now, share)
        return live, behind

    async def _serve(self, lane: Lane, now: datetime, limit: int) -> int:
        """Make the jobs of the lane's schedules (at most ``limit`` each), then advance them;
        returns how many schedules the lane held."""
        planned: list[_Planned] = []
        refused = list(lane.unreadable)
        for schedule in lane.schedules:
            try:
                planned.append(self._plan(schedule, now, limit))
            except Exception as exc:  # whatever it is, it is this schedule's alone
                refused.append(parked(schedule.id, "cannot be planned", exc))
        failed = await self._submit(planned)
        refused.extend(failed)
        failed_ids = {item.schedule_id for item in failed}
        await lane.advance([p.advance for p in planned if p.schedule.id not in failed_ids])
        if refused:
            await lane.park(refused)  # with the advances, once every job is stored
            self._count_parked(refused)
        return len(lane.schedules) + len(lane.unreadable)

    async def _submit(self, planned: Sequence[_Planned]) -> list[Parked]:
        """Store the jobs, a namespace's in batches; returns the schedules whose jobs PostgreSQL
        refused (their namespace's jobs are stored schedule by schedule to find them). Any other
        failure is the pass's (the database, a bug): it is raised, and no schedule is parked."""
        by_namespace: dict[str | None, list[_Planned]] = defaultdict(list)
        for item in planned:
            by_namespace[item.schedule.namespace].append(item)
        failed: list[Parked] = []
        for namespace, items in by_namespace.items():
            jobs = [job for item in items for job in item.jobs]
            try:
                for first in range(0, len(jobs), SUBMIT_BATCH):
                    batch = jobs[first : first + SUBMIT_BATCH]
                    await self._intake.submit(batch, namespace=namespace)
            except errors.JobRefused:
                failed.extend(await self._submit_each(items, namespace))
        return failed

    async def _submit_each(self, items: Sequence[_Planned], namespace: str | None) -> list[Parked]:
        failed = []
        for item in items:
            try:  # what an earlier batch stored already is found by its key: stored once
                await self._intake.submit(item.jobs, namespace=namespace)
            except errors.JobRefused as exc:
                failed.append(parked(item.schedule.id, "its jobs cannot be stored", exc))
        return failed

    def _count_parked(self, refused: Sequence[Parked]) -> None:
        for item in refused:
            logger.error(
                "schedule %d parked (paused): %s",
                item.schedule_id,
                item.reason,
                extra={"action": "schedules"},
            )
        if self._metrics is not None:
            self._metrics.schedules_parked.inc(len(refused))

    def _plan(self, schedule: Schedule, now: datetime, limit: int) -> _Planned:
        assert schedule.next_at is not None  # only active schedules are due
        plan = occurrences.plan(
            schedule.spec.timing,
            schedule.next_at,
            now=now,
            ahead_s=self._ahead.total_seconds(),
            grace_s=schedule.spec.grace_s,
            missed=schedule.spec.missed,
            limit=limit,
            catchup_s=self._catchup_s,
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
        return _Planned(
            schedule,
            [schedule.job(at) for at in plan.fire],
            Advance(schedule.id, plan.next_at, last),
        )
