"""FlowMeter: lets a metered flow rule's jobs go, at its rate and within its number in flight,
cluster-wide.

A metered rule's jobs are held like a paused one's (the loads and claims pass over them), so none
goes unless the meter lets it. Every ``TICK_S`` the meter looks for the oldest due jobs its busy
rules govern on the shards this node owns (``FlowRuleStore.metered_due``; which rules, and from
where: ``flow.looks``), asks PostgreSQL to let them go (``FlowRuleStore.take``: one bucket of
tokens and one count of slots per rule, shared by every node, each taking under the rule's row
lock), and hands those let go to the recovery lane, which firing serves first, each with a
grant (``flow.grants``): the claim takes it though its rule holds its key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping

from dispatcher.firing import lanes
from dispatcher.flow.grants import Grants
from dispatcher.flow.looks import MeteredLook, MeterLooks
from dispatcher.flow.watch import RuleWatch
from dispatcher.models import DueEntry
from dispatcher.store.flow_rules import FlowRuleStore, Meter
from dispatcher.timing.kinds import Mono, NodeDate

TICK_S = 0.05
IDLE_S = 0.5  # no metered rule, or no shard: look at the rules again after this
MIN_PAUSE_S = 0.01  # between two looks, however long the last took


class FlowMeter:
    def __init__(
        self,
        watch: RuleWatch,
        store: FlowRuleStore,
        due_lanes: lanes.Lanes,
        grants: Grants,
        *,
        epochs: Callable[[], Mapping[int, int]],
        now_dt: NodeDate,
        mono: Mono = time.monotonic,
        tick_s: float = TICK_S,
    ) -> None:
        self._watch = watch
        self._store = store
        self._lanes = due_lanes
        self._grants = grants
        self._epochs = epochs
        self._now_dt = now_dt
        self._mono = mono
        self._tick_s = tick_s
        self._looks = MeterLooks()
        self._counted: Callable[[int], None] = lambda _count: None

    def count_with(self, counted: Callable[[int], None]) -> None:
        """Hand each number of jobs let go to ``counted`` (the metrics)."""
        self._counted = counted

    def offered(self, entries: Iterable[DueEntry]) -> None:
        """Jobs just stored or moved (intake, due notices): see ``MeterLooks.offered``."""
        self._looks.offered(entries)

    async def run(self) -> None:
        """Look and let go forever, a look every ``tick_s`` from the start of the last (a look
        slowed by a loaded database or event loop shortens the wait after it: a rule's bucket,
        refilled meanwhile, holds at most its burst, and looks spaced further apart than the
        burst lasts would lose its rate); PostgreSQL away ends it (the supervisor runs it
        again)."""
        while True:
            started = self._mono()
            if await self.look():
                # Never back to back: a look slower than a tick (a database under load) still
                # leaves the loop and the pool a pause before the next.
                await asyncio.sleep(max(MIN_PAUSE_S, started + self._tick_s - self._mono()))
            else:
                await self._watch.wait_changed(IDLE_S)

    async def look(self) -> bool:
        """One tick: the quiet rules' walk when due, then every busy rule's jobs let go as its
        meter allows. False when there is nothing to meter."""
        shards = frozenset(self._epochs())
        now_mono = self._mono()
        looks = self._looks
        metered, tags = self._watch.metered()
        if not looks.start(shards, metered, tags, now_mono):
            return False
        owned = sorted(shards)
        since = looks.walk_from(now_mono)
        if since is not None:
            walked_at, woken = await self._store.metered_waking(
                owned, since, looks.quiet_first_words, looks.tags
            )
            looks.walked(since, walked_at, woken)
        busy = looks.looks()
        if not busy:
            return True
        looked_at = self._now_dt()
        found = await self._store.metered_due(owned, busy, looks.tags)
        for look in busy:
            asked = looks.found(look, found[look.tag], looked_at)
            if asked:
                await self._let_go(look, asked, now_mono)
        return True

    async def _let_go(self, look: MeteredLook, asked: list[DueEntry], now_mono: float) -> None:
        rule = look.rule
        taken = set(
            await self._store.take(
                rule.key, rule.namespace, Meter.of(rule.limits), [entry.id for entry in asked]
            )
        )
        granted = [entry for entry in asked if entry.id in taken]
        if granted:
            self._grants.grant((entry.id for entry in granted), now_mono)
            self._lanes.recover(granted)
            self._looks.granted(look, granted, now_mono)
            self._counted(len(granted))
