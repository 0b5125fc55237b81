"""FlowMeter: lets a metered flow rule's jobs go, at its rate and within its number in flight,
cluster-wide.

A metered rule's jobs are held like a paused one's (the loads and claims pass over them), so none
goes unless the meter lets it. Every ``TICK_S`` the meter looks, for each *busy* metered rule,
for the oldest due jobs of the shards this node owns (``FlowRuleStore.metered_due``), asks
PostgreSQL to let them go (``FlowRuleStore.take``: one bucket of tokens and one count of slots
per rule, shared by every node, each taking under the rule's row lock), and hands those let go
to the recovery lane, which firing serves first; their entries are ``granted``, so the claim
takes them though their rule holds their key.

A busy rule's look starts from its floor, the run_at of the oldest job it found last: a key's
backlog is walked from its head, not from the beginning. A rule whose look found nothing is
*quiet*: the quiet rules are looked at together every ``QUIET_S``, one walk of the due index
from where the last such walk ended (less ``QUIET_MARGIN``, for jobs committed late), which
tells which of them have jobs due (``metered_waking``); those are busy again. Looking at each
quiet rule apart would walk the index once per rule. A job stored behind that walk (due before
it, committed after it) is offered by intake or a due notice (``offered``), which moves the walk
back; a whole walk, from the beginning, every ``RESCAN_S`` and after every change of the rules
or of the shards owned, finds what was missed otherwise.

A job let go and not yet claimed is not asked for again for ``PENDING_S`` (its token is spent
once); one that never fired (its node died) is asked for again after that, and keeps its slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta

from dispatcher.firing import lanes
from dispatcher.flow.rules import Rule
from dispatcher.flow.watch import RuleWatch
from dispatcher.models import DueEntry
from dispatcher.store.flow_rules import FlowRuleStore, Meter, MeteredLook

logger = logging.getLogger(__name__)

TICK_S = 0.05
IDLE_S = 0.5  # no metered rule, or no shard: look at the rules again after this
QUIET_S = 0.1
QUIET_MARGIN = timedelta(seconds=0.05)
RESCAN_S = 30.0
PENDING_S = 10.0
# At most this many jobs of one rule are asked for in one look (a rule without a rate wants as
# many as it has slots).
MOST_WANTED = 500
BEGINNING = datetime(1, 1, 2, tzinfo=UTC)

RuleId = tuple[str, str | None]


def wanted(rule: Rule) -> int:
    """How many jobs one look asks for: a burst's worth, and no more than the slots."""
    limits = rule.limits
    most = MOST_WANTED
    if limits.burst is not None:
        most = min(most, limits.burst)
    if limits.max_in_flight is not None:
        most = min(most, limits.max_in_flight)
    return max(1, most)


class FlowMeter:
    def __init__(
        self,
        watch: RuleWatch,
        store: FlowRuleStore,
        due_lanes: lanes.Lanes,
        *,
        epochs: Callable[[], Mapping[int, int]],
        clock: Callable[[], datetime],
        mono: Callable[[], float] = time.monotonic,
        tick_s: float = TICK_S,
    ) -> None:
        self._watch = watch
        self._store = store
        self._lanes = due_lanes
        self._epochs = epochs
        self._clock = clock
        self._mono = mono
        self._tick_s = tick_s
        self._busy: dict[RuleId, datetime] = {}  # the busy rules, and their floors
        self._quiet_since = BEGINNING  # the next walk for quiet rules starts here
        self._quiet_at = 0.0  # (monotonic) the next walk for quiet rules
        self._pending: dict[RuleId, dict[uuid.UUID, float]] = {}
        self._looked: tuple[frozenset[int], tuple[Rule, ...]] = (frozenset(), ())
        self._metered_keys: frozenset[str] = frozenset()
        self._tags = "{}"  # ``RuleBook.governing_tags`` of the rules looked at
        self._rescan_at = 0.0
        self._counted: Callable[[int], None] = lambda _count: None

    def count_with(self, counted: Callable[[int], None]) -> None:
        """Hand each number of jobs let go to ``counted`` (the metrics)."""
        self._counted = counted

    def offered(self, entries: Iterable[DueEntry]) -> None:
        """Jobs just stored or moved (intake, due notices): one a metered rule may govern moves
        the next walk for quiet rules back to it (its key unknown, "", may be metered)."""
        if not self._metered_keys:
            return
        for entry in entries:
            if _may_meter(entry.key, self._metered_keys):
                at = datetime.fromtimestamp(entry.run_at_s, UTC) - QUIET_MARGIN
                self._quiet_since = max(BEGINNING, min(self._quiet_since, at))
                self._quiet_at = 0.0

    async def run(self) -> None:
        """Look and let go forever; PostgreSQL away ends it (the supervisor runs it again)."""
        while True:
            if await self.look():
                await asyncio.sleep(self._tick_s)
            else:
                await self._watch.wait_changed(IDLE_S)

    async def look(self) -> bool:
        """One look: the quiet rules' walk when due, then every busy rule's jobs let go as its
        meter allows. False when there is nothing to meter."""
        metered = self._watch.metered()
        shards = frozenset(self._epochs())
        if not metered or not shards:
            self._looked, self._metered_keys = (frozenset(), ()), frozenset()
            self._busy.clear()
            self._pending.clear()
            return False
        now_mono = self._mono()
        looked = (shards, tuple(metered))
        if looked != self._looked or now_mono >= self._rescan_at:
            # A whole walk, from the beginning: every rule with a job due is busy again.
            self._looked = looked
            self._metered_keys = frozenset(rule.key for rule in metered)
            self._tags = self._watch.book.governing_tags(metered)  # once per change: O(rules)
            self._busy.clear()
            self._quiet_since, self._quiet_at = BEGINNING, 0.0
            self._rescan_at = now_mono + RESCAN_S
        tags = self._tags
        if now_mono >= self._quiet_at:
            await self._wake_quiet(shards, metered, tags)
            self._quiet_at = now_mono + QUIET_S
        pending = self._pending_now(metered, now_mono)
        looks = [
            MeteredLook(
                rule=rule,
                tag=tag,
                wanted=wanted(rule) + len(pending[_id(rule)]),
                floor=self._busy[_id(rule)],
            )
            for tag, rule in enumerate(metered)
            if _id(rule) in self._busy
        ]
        if not looks:
            return True
        looked_at = self._clock()
        found = await self._store.metered_due(sorted(shards), looks, tags)
        for look in looks:
            entries, rule_id = found[look.tag], _id(look.rule)
            if not entries:
                # Quiet now: the quiet rules' walk takes it from the time of this look.
                del self._busy[rule_id]
                self._quiet_since = min(self._quiet_since, looked_at - QUIET_MARGIN)
                continue
            self._busy[rule_id] = datetime.fromtimestamp(entries[0].run_at_s, UTC)
            asked = [entry for entry in entries if entry.id not in pending[rule_id]]
            asked = asked[: wanted(look.rule)]
            if asked:
                await self._let_go(look.rule, asked, pending[rule_id], now_mono)
        return True

    async def _wake_quiet(self, shards: frozenset[int], metered: list[Rule], tags: str) -> None:
        """The quiet rules with jobs due since the last walk are busy again."""
        quiet = [rule for rule in metered if _id(rule) not in self._busy]
        if not quiet:
            return
        first_words = sorted({rule.key.split(".", 1)[0] for rule in quiet})
        since = self._quiet_since
        looked_at, woken = await self._store.metered_waking(
            sorted(shards), since, first_words, tags
        )
        self._quiet_since = max(BEGINNING, looked_at - QUIET_MARGIN)
        for tag in woken:
            # Its jobs due before the walk's start were none when it went quiet.
            if tag < len(metered) and _id(metered[tag]) not in self._busy:
                self._busy[_id(metered[tag])] = since

    async def _let_go(
        self,
        rule: Rule,
        asked: list[DueEntry],
        pending: dict[uuid.UUID, float],
        now_mono: float,
    ) -> None:
        taken = set(
            await self._store.take(
                rule.key, rule.namespace, Meter.of(rule.limits), [entry.id for entry in asked]
            )
        )
        granted = [entry._replace(granted=True) for entry in asked if entry.id in taken]
        if granted:
            self._lanes.recover(granted)
            pending.update((entry.id, now_mono) for entry in granted)
            self._counted(len(granted))

    def _pending_now(
        self, metered: list[Rule], now_mono: float
    ) -> dict[RuleId, dict[uuid.UUID, float]]:
        """The jobs let go less than ``PENDING_S`` ago, by rule (those of rules gone dropped)."""
        kept: dict[RuleId, dict[uuid.UUID, float]] = {}
        for rule in metered:
            rule_id = _id(rule)
            kept[rule_id] = {
                job_id: at
                for job_id, at in self._pending.get(rule_id, {}).items()
                if now_mono - at < PENDING_S
            }
        self._pending = kept
        return kept


def _id(rule: Rule) -> RuleId:
    return rule.key, rule.namespace


def _may_meter(routing_key: str, keys: frozenset[str]) -> bool:
    """Whether a rule of ``keys`` matches ``routing_key`` (an unknown key, "", may match): its
    prefixes looked up, a few set lookups whatever the number of rules."""
    if not routing_key:
        return True
    prefix = routing_key
    while prefix not in keys:
        cut = prefix.rfind(".")
        if cut < 0:
            return False
        prefix = prefix[:cut]
    return True
