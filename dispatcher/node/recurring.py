"""Recurring schedules: their table, and the materialiser that turns due occurrences into jobs
through intake."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.lifecycle import Phase, Task
from dispatcher.node.core import Core
from dispatcher.node.submission import Submission
from dispatcher.recurring.materialiser import Materialiser
from dispatcher.store.schedules import ScheduleStore


@dataclass(frozen=True, slots=True)
class Recurring:
    schedules: ScheduleStore
    materialiser: Materialiser

    def tasks(self) -> list[Task]:
        return [Task("schedules", self.materialiser.run, Phase.DRAIN, self.materialiser.stop)]


def build_recurring(core: Core, submission: Submission) -> Recurring:
    settings = core.settings
    schedules = ScheduleStore(core.db)
    return Recurring(
        schedules=schedules,
        materialiser=Materialiser(
            schedules,
            submission.intake,
            ahead_s=settings.schedule_ahead_s,
            poll_s=settings.schedule_poll_s,
            per_schedule=settings.schedule_catchup_batch,
            catchup_s=settings.schedule_catchup_window_s,
            metrics=core.metrics,
            now_dt=core.timekeeper.now_dt,
        ),
    )
