"""Where new jobs come in: intake stores them (group commit) and offers the ones due soon to the
loaded window."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.intake.service import Intake
from dispatcher.lifecycle import Task
from dispatcher.node.coordination import Coordination
from dispatcher.node.core import Core
from dispatcher.node.firing import Firing


@dataclass(frozen=True, slots=True)
class Submission:
    intake: Intake

    def tasks(self) -> list[Task]:
        return [Task("intake", self.intake.run)]


def build_submission(core: Core, coordination: Coordination, firing: Firing) -> Submission:
    settings = core.settings
    return Submission(
        Intake(
            store=core.jobs,
            window=firing.loader,
            ownership=coordination.ownership,
            metrics=core.metrics,
            shard_count=settings.shard_count,
            lookahead_s=settings.lookahead_s,
            group_commit=settings.group_commit,
            now=core.timekeeper.now,
        )
    )
