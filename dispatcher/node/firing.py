"""The firing path: the loader fills the due lanes from the shards this node owns, flow control
holds what a rule holds, and the firer claims and publishes what is due."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dispatcher import supervision
from dispatcher.firing import lanes, loader, pacing
from dispatcher.firing.firer import Firer, Publishers
from dispatcher.firing.loader import Loader, SweepTimes, WindowLimits
from dispatcher.flow.control import FlowControl
from dispatcher.lifecycle import Phase, Task
from dispatcher.node.coordination import Coordination
from dispatcher.node.core import Core
from dispatcher.node.messaging import Messaging
from dispatcher.store import due_notices
from dispatcher.store.flow_rules import FlowRuleStore

# The node's log lines keep the name operators filter on.
logger = logging.getLogger("dispatcher.node")
# A live node whose shard moved has its confirm timeout and this much more (the mark's round trip)
# to settle a claim it made before another node fires it again (``loader.SweepTimes``).
HANDOVER_MARK_S = 2.0


@dataclass(frozen=True, slots=True)
class Firing:
    lanes: lanes.Lanes  # the due lanes: the loader fills them, the firer takes from them
    flow: FlowControl  # its rules read before firing: loads and claims pass over what they hold
    loader: Loader
    firer: Firer
    core: Core
    coordination: Coordination

    def tasks(self) -> list[Task]:
        reload = supervision.Backoff(first_s=loader.RETRY_FIRST_S, max_s=loader.RETRY_MAX_S)
        return [
            Task("ownership-watch", self._watch_ownership),
            Task("loader", self.loader.run, backoff=reload),
            Task("sweeper", self.loader.run_sweeps, backoff=reload),
            Task("firing", self.firer.run, Phase.DRAIN, self.firer.stop),
            *self.flow.tasks(),
        ]

    async def _watch_ownership(self) -> None:
        ownership = self.coordination.ownership
        while True:
            change = await ownership.next_change()
            self.loader.lose(change.lost)
            self.loader.gain(change.gained)
            self.core.metrics.shards_owned.set(len(ownership.epochs()))
            logger.info(
                "ownership: +%d -%d shards, %d owned",
                len(change.gained),
                len(change.lost),
                len(ownership.epochs()),
                extra={"action": "ownership"},
            )

    def horizon_s(self) -> float:
        """How far ahead of the node's time the loaded window reaches."""
        horizon = self.loader.horizon
        now = self.core.timekeeper.now()
        return 0.0 if horizon is None else max(0.0, horizon.timestamp() - now)


def build_firing(core: Core, coordination: Coordination, messaging: Messaging) -> Firing:
    settings = core.settings
    ownership = coordination.ownership
    due = lanes.Lanes(
        catchup_share=settings.catchup_share,
        pace=pacing.Pace(settings.catchup_max_rate, batch=settings.fire_batch),
    )
    flow = FlowControl(
        FlowRuleStore(
            core.db,
            max_rules=settings.max_flow_rules,
            max_rules_per_namespace=settings.max_flow_rules_per_namespace,
        ),
        due,
        core.metrics,
        epochs=ownership.epochs,
        now_dt=core.timekeeper.now_dt,
    )
    loads = Loader(
        core.jobs,
        due,
        window=WindowLimits(
            lookahead_s=settings.lookahead_s,
            heap_cap=settings.heap_cap,
            load_batch=settings.load_batch,
            live_lag_s=settings.live_lag_s,
        ),
        sweeps=SweepTimes(
            every_s=min(settings.lease_s / 2, 5.0),
            grace_s=settings.sweep_grace_s,
            handover_s=settings.publish_timeout_s + HANDOVER_MARK_S,
        ),
        now=core.timekeeper.now,
        members=ownership.members,
        admission=flow,
    )
    due_notices.subscribe(
        core.notices,
        offer=loads.offer,
        on_connect=lambda: loads.rewind(settings.sweep_grace_s),
        shard_count=settings.shard_count,
    )
    flow.listen(core.notices)
    flow.follow(loads)
    firer = Firer(
        store=core.jobs,
        publishers=Publishers(shared=messaging.publisher, live=messaging.live_publisher),
        ownership=ownership,
        due_lanes=due,
        metrics=core.metrics,
        batch=settings.fire_batch,
        workers=settings.fire_workers,
        timekeeper=core.timekeeper,
        admission=flow,
    )
    firing = Firing(
        lanes=due, flow=flow, loader=loads, firer=firer, core=core, coordination=coordination
    )
    core.metrics.heap_size.set_function(lambda: due.live_count)
    core.metrics.window_horizon.set_function(firing.horizon_s)
    return firing
