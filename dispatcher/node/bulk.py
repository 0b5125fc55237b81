"""Bulk actions: their table with the bounds every action runs under, and the runner that carries
out the actions of the shards this node owns."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.bulk import model
from dispatcher.bulk.runner import BulkRunner
from dispatcher.lifecycle import Phase, Task
from dispatcher.node.coordination import Coordination
from dispatcher.node.core import Core
from dispatcher.node.firing import Firing
from dispatcher.store.bulk_actions import BulkActionStore


@dataclass(frozen=True, slots=True)
class Bulk:
    actions: BulkActionStore
    runner: BulkRunner

    def tasks(self) -> list[Task]:
        return [Task("bulk-actions", self.runner.run, Phase.DRAIN, self.runner.stop)]


def build_bulk(core: Core, coordination: Coordination, firing: Firing) -> Bulk:
    settings = core.settings
    actions = BulkActionStore(
        core.db,
        model.Bounds(
            count_cap=settings.bulk_count_cap,
            read_timeout_s=settings.bulk_read_timeout_s,
            batch_timeout_s=settings.bulk_batch_timeout_s,
            reads=settings.bulk_reads,
            read_duty=settings.bulk_read_duty,
            reads_per_s=settings.bulk_reads_per_s,
            max_running=settings.bulk_max_running,
            max_stored=settings.bulk_max_stored,
            keep_s=settings.bulk_keep_s,
        ),
    )
    epochs = coordination.ownership.epochs
    runner = BulkRunner(
        actions,
        core.metrics,
        node_id=settings.node_id,
        batch=settings.bulk_batch,
        poll_s=settings.bulk_poll_s,
        lease_s=settings.bulk_lease_s,
        duty=settings.bulk_duty,
        rate_per_s=settings.bulk_rate_per_s,
        shards=lambda: list(epochs()),
        notify_within_s=settings.lookahead_s,
        on_requeued=firing.loader.catch_up,
    )
    return Bulk(actions=actions, runner=runner)
