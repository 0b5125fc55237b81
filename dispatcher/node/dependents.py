"""Jobs that wait on others: the follower releases or cancels the dependents of each job that
ended."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.dependencies.followup import DependentsFollower
from dispatcher.lifecycle import Phase, Task
from dispatcher.node.core import Core


@dataclass(frozen=True, slots=True)
class Dependents:
    follower: DependentsFollower

    def tasks(self) -> list[Task]:
        return [Task("dependents", self.follower.run, Phase.DRAIN, self.follower.stop)]


def build_dependents(core: Core) -> Dependents:
    settings = core.settings
    return Dependents(
        DependentsFollower(
            core.db,
            core.metrics,
            batch=settings.dependents_batch,
            poll_s=settings.dependents_poll_s,
        )
    )
