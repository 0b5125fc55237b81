"""FlowControl: flow control's one runtime owner, the object the node builds.

It holds the rules as the node knows them (``watch.RuleWatch``), the meter that lets a metered
rule's jobs go (``meter.FlowMeter``) and the grants the meter hands out (``grants.Grants``).
Firing sees it only as ``firing.admission.Admission``; the API reads and changes the rules
through ``store`` and ``book``/``refresh``; the node runs its ``tasks``.

A held job's states, and who moves each edge (the job's own state stays ``scheduled``
throughout: holding it is flow control's business alone, not a state of the job):

    due -> held            a rule restrains its key: the loads, sweeps and claims pass over it
                           (``Admission.held``, in SQL: ``queries.shared.not_held``)
    held -> released       the rule is resumed, deleted, changed, or its pause ran out: the watch
                           tells the loader (``follow``), which looks again at what it passed over
    held -> granted        the rule's meter let it go (``FlowMeter``): a token and a slot spent in
                           PostgreSQL, a grant by job id here, the entry in the recovery lane
    granted -> fired       the claim takes it though its rule holds it (``Admission.granted``);
                           given back after a failed publish, it is claimed under the same grant
    granted -> held        the grant ran out (``grants``: ``looks.PENDING_S``) before it fired
                           (its node died, say): the meter asks for it again, its slot kept
    released -> fired      as any job

A job's lateness while a rule held it counts apart (``held_at``): an operator chose it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Protocol

from dispatcher import lifecycle, metrics
from dispatcher.firing import lanes
from dispatcher.flow import watch as flow_watch
from dispatcher.flow.grants import Grants
from dispatcher.flow.meter import FlowMeter
from dispatcher.flow.rules import HeldKeys, RuleBook
from dispatcher.flow.watch import RuleWatch
from dispatcher.models import DueEntry
from dispatcher.store.flow_rules import FlowRuleStore
from dispatcher.store.listen import ChannelListener
from dispatcher.timing.kinds import Mono, NodeDate


class Loads(Protocol):
    """What flow control tells the loader (``firing.loader.Loader``)."""

    def release(self) -> None:
        """Jobs the loads passed over may be held no more: look again."""

    def when_offered(self, callback: Callable[[Iterable[DueEntry]], None]) -> None:
        """Hand ``callback`` every job offered to the loader (stored or moved just now)."""


class FlowControl:
    def __init__(
        self,
        store: FlowRuleStore,
        due_lanes: lanes.Lanes,
        node_metrics: metrics.Metrics,
        *,
        epochs: Callable[[], Mapping[int, int]],
        now_dt: NodeDate,
        mono: Mono = time.monotonic,
    ) -> None:
        """``now_dt``: the node's time; ``epochs``: the shards this node owns now."""
        self.store = store
        self._mono = mono
        self._metrics = node_metrics
        self._watch = RuleWatch(store, now_dt=now_dt)
        self._watch.count_with(self._count_rules)
        self._grants = Grants()
        self._meter = FlowMeter(
            self._watch, store, due_lanes, self._grants, epochs=epochs, now_dt=now_dt, mono=mono
        )
        self._meter.count_with(node_metrics.flow_let_go.inc)

    # --- firing's view (``firing.admission.Admission``) --------------------------------------

    def held(self) -> HeldKeys:
        return self._watch.held()

    def granted(self, ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
        return self._grants.granted(ids, self._mono())

    def held_at(self, routing_key: str, namespace: str | None, run_at: datetime) -> bool:
        return self._watch.held_at(routing_key, namespace, run_at)

    # --- the node's ---------------------------------------------------------------------------

    def follow(self, loads: Loads) -> None:
        """Tell the loader when held jobs may be held no more; hear of every job it is offered
        (one of a metered key may be stored behind the meter's look)."""
        self._watch.when_released(loads.release)
        loads.when_offered(self._meter.offered)

    def listen(self, notices: ChannelListener) -> None:
        """Read the rules again on each notice of a change, and after each reconnection."""
        notices.subscribe(
            flow_watch.CHANNEL,
            on_notice=lambda _payload: self._watch.changed(),
            on_connect=self._watch.changed,
        )

    async def load(self) -> None:
        """Read every rule: before the node fires anything, a paused key is never fired."""
        await self._watch.load()

    def tasks(self) -> list[lifecycle.Task]:
        return [
            lifecycle.Task("flow-rules", self._watch.run),
            lifecycle.Task("flow-meter", self._meter.run),
        ]

    # --- the API's ----------------------------------------------------------------------------

    @property
    def book(self) -> RuleBook:
        """The rules as this node applies them now."""
        return self._watch.book

    async def refresh(self) -> None:
        """A change made through this node: applied at once (PostgreSQL away: at the next poll)."""
        await self._watch.refresh()

    def _count_rules(self, counts: dict[str, int]) -> None:
        for kind, count in counts.items():
            self._metrics.flow_rules.labels(limit=kind).set(count)
