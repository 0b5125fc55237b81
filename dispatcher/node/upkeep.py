"""What keeps a node honest about itself: its standing (a node that cannot reach a service gives
its shards away), the job counts and retention, and the snapshot holding vacuum back."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.health import Health, Service
from dispatcher.lifecycle import Task
from dispatcher.node.coordination import Coordination
from dispatcher.node.core import Core
from dispatcher.node.messaging import Messaging
from dispatcher.store.snapshots import SnapshotStore
from dispatcher.upkeep.housekeeping import Housekeeper
from dispatcher.upkeep.stewardship import Steward
from dispatcher.upkeep.vacuum_horizon import Horizon
from dispatcher.upkeep.vacuum_watch import VacuumWatch


@dataclass(frozen=True, slots=True)
class Upkeep:
    steward: Steward
    housekeeper: Housekeeper
    vacuum_watch: VacuumWatch

    def tasks(self) -> list[Task]:
        return [
            Task("standing", self.steward.run),
            Task("housekeeping", self.housekeeper.run),
            Task("vacuum-watch", self.vacuum_watch.run),
        ]


def build_upkeep(core: Core, coordination: Coordination, messaging: Messaging) -> Upkeep:
    settings = core.settings
    return Upkeep(
        steward=Steward(
            Health(step_out_s=settings.step_out_s, rejoin_s=settings.rejoin_s),
            coordination.ownership,
            core.metrics,
            probes={
                Service.POSTGRES: core.db.probe,
                Service.RABBITMQ: messaging.publisher.probe,
            },
            distrust_clock=core.timekeeper.distrust,
        ),
        housekeeper=Housekeeper(
            messaging.history,
            core.metrics,
            retention_s=settings.retention_days * 86400,
            batch=settings.retention_batch,
            stats_interval_s=settings.stats_interval_s,
            routing_keys=settings.stats_routing_keys,
        ),
        vacuum_watch=VacuumWatch(
            SnapshotStore(core.db),
            Horizon(warn_after_s=settings.snapshot_warn_s),
            core.metrics,
            interval_s=settings.stats_interval_s,
        ),
    )
