"""RuleWatch: the node's copy of the flow rules, kept within a second of PostgreSQL's.

The rules are read before the node fires anything, again on each notice of a change (LISTEN
``dispatcher_flow_rules``), and whenever the change counter moved (polled every ``poll_s``: a
notice lost with its connection is caught by the next poll). The watch also wakes when a pause
runs out by itself (``paused_until``).

When something held may be held no more (a resume, a rule deleted or changed, a pause run out),
the watch says so (``when_released``): the loader then looks again at what its loads passed over.

What the node asks of the rules (``Weighed``) is made once per change, in a worker thread: ten
thousand rules take tens of milliseconds to weigh, linear as ``RuleBook`` is, and the event loop
(the HTTP API, firing) keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher import errors, supervision
from dispatcher.flow import rules
from dispatcher.flow.rules import HeldKeys, Rule, RuleBook
from dispatcher.store.flow_rules import FlowRuleStore
from dispatcher.timing.kinds import NodeDate

logger = logging.getLogger(__name__)

CHANNEL = "dispatcher_flow_rules"
READING = "reading the rules"  # what shows degraded in /readyz while PostgreSQL is away
POLL_S = 0.5
# The rules that stopped holding are remembered this long (at most RELEASES_KEPT of them): the
# jobs they held, fired since, count their lateness apart (``held_at``).
RELEASES_KEPT = 100
RELEASE_MEMORY = timedelta(days=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Weighed:
    """What the node asks of one book of rules at one instant."""

    book: RuleBook
    at: datetime
    held: HeldKeys
    held_until: datetime | None  # weigh again from this instant (a pause runs out)
    metered: list[Rule]
    tags: str  # ``RuleBook.governing_tags(metered)``
    counts: dict[str, int]
    holding: list[Rule]  # every rule that restrains its jobs at ``at``


def weigh(book: RuleBook, now: datetime) -> Weighed:
    metered = book.metered(now)
    return Weighed(
        book=book,
        at=now,
        held=book.holding(now),
        held_until=book.next_change(now),
        metered=metered,
        tags=book.governing_tags(metered, now) if metered else "{}",
        counts=book.counts(now),
        holding=[rule for rule in book if rule.limits.restrains_at(now)],
    )


@dataclass(frozen=True, slots=True)
class Release:
    rule: Rule
    at: datetime


class RuleWatch:
    def __init__(self, store: FlowRuleStore, *, now_dt: NodeDate, poll_s: float = POLL_S) -> None:
        self._store = store
        self._now_dt = now_dt
        self._poll_s = poll_s
        self._epoch: int | None = None
        self._book = RuleBook()
        self._held = rules.NOTHING_HELD
        self._held_until: datetime | None = None  # recompute ``_held`` from this instant
        self._metered: list[Rule] = []  # what the meter asks for every tick: kept, not rebuilt
        self._tags = "{}"
        self._changed = asyncio.Event()
        self._read = asyncio.Event()  # set whenever the rules were read or recomputed
        self._on_release: list[Callable[[], None]] = []
        self._releases: deque[Release] = deque(maxlen=RELEASES_KEPT)
        self._last_holding: list[Rule] = []
        self._counted: Callable[[dict[str, int]], None] = lambda _counts: None

    @property
    def book(self) -> RuleBook:
        return self._book

    def when_released(self, callback: Callable[[], None]) -> None:
        self._on_release.append(callback)

    def count_with(self, counted: Callable[[dict[str, int]], None]) -> None:
        """Hand the rules' counts by kind to ``counted`` whenever they change (the metrics)."""
        self._counted = counted

    def held_at(self, routing_key: str, namespace: str | None, run_at: datetime) -> bool:
        """Whether a rule held a job due at ``run_at``: one holds it now (a claim re-fired
        while its key is paused), or one that held it was let go since (its lateness was chosen
        by an operator, not the dispatcher's)."""
        if not self._held and not self._releases:
            return False  # nothing holds, nothing was let go: the common case, at once
        if self._book.holds(routing_key, namespace, self._now_dt()) is not None:
            return True
        return any(
            release.at > run_at and release.rule.matches(routing_key, namespace or "")
            for release in self._releases
        )

    def held(self) -> HeldKeys:
        """What the rules hold now (the store's loads and claims pass over it)."""
        if self._held_until is not None and self._now_dt() >= self._held_until:
            self._install(weigh(self._book, self._now_dt()))  # rare: the watch's run is late
        return self._held

    def metered(self) -> tuple[list[Rule], str]:
        """The rules whose meter lets their jobs go now, and their ``RuleBook.governing_tags``
        (``flow.meter``): made once per change of the rules, not at every tick."""
        self.held()  # a pause run out since: recomputed first
        return self._metered, self._tags

    async def wait_changed(self, timeout_s: float) -> None:
        """Until the rules are read again, or ``timeout_s`` passed."""
        self._read.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._read.wait()

    def changed(self) -> None:
        """A notice, or a change made through this node: read the rules again at once."""
        self._changed.set()

    async def refresh(self) -> None:
        """A change made through this node: read the rules now (PostgreSQL away: at the next
        poll, which retries)."""
        try:
            await self.load()
        except errors.StoreUnavailable:
            self.changed()

    async def load(self) -> None:
        """Read every rule (before the node fires: a paused key is never fired by a start)."""
        epoch, stored = await self._store.snapshot()
        if self._stale(epoch):
            return
        now = self._now_dt()
        weighed = await asyncio.to_thread(lambda: weigh(RuleBook(stored), now))
        if self._stale(epoch):
            return
        self._epoch = epoch
        self._install(weighed)

    def _stale(self, epoch: int) -> bool:
        """Read before a load that was applied already (the API's and the loop's)."""
        return self._epoch is not None and epoch < self._epoch

    async def run(self) -> None:
        """Follow the rules forever. PostgreSQL away: degraded, and asked again at the next poll
        (the rules last read still apply); working again as soon as one read is."""
        while True:
            self._changed.clear()
            try:
                if self._epoch is None or await self._store.epoch() != self._epoch:
                    await self.load()
                supervision.report_recovered(READING)
            except errors.StoreUnavailable as exc:
                supervision.report_degraded(READING, exc)
            wait_s = self._poll_s
            if self._held_until is not None:
                until_s = (self._held_until - self._now_dt()).total_seconds()
                wait_s = max(0.0, min(wait_s, until_s))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()
            if self._held_until is not None and self._now_dt() >= self._held_until:
                book = self._book
                weighed = await asyncio.to_thread(weigh, book, self._now_dt())
                if book is self._book:  # not read again meanwhile
                    self._install(weighed)

    def _install(self, weighed: Weighed) -> None:
        before, self._held = self._held, weighed.held
        self._book = weighed.book
        self._held_until = weighed.held_until
        if weighed.metered != self._metered:
            self._metered = weighed.metered  # the same list while unchanged: the meter's test
        # The tags weigh the other rules too (a tenant's pause below an operator's meter).
        self._tags = weighed.tags
        self._counted(weighed.counts)
        self._read.set()
        self._remember_releases(weighed.at, weighed.holding)
        if before and before.weighed != self._held.weighed:
            logger.info(
                "flow rules changed: %d keys held",
                self._held.held_count(),
                extra={"action": "flow"},
            )
            for callback in self._on_release:
                callback()

    def _remember_releases(self, now: datetime, holding: list[Rule]) -> None:
        """Note each rule that held until now and holds no more (resumed, deleted, run out)."""
        still = {(rule.key, rule.namespace) for rule in holding}
        self._releases.extend(
            Release(rule, now)
            for rule in self._last_holding
            if (rule.key, rule.namespace) not in still
        )
        self._last_holding = holding
        while self._releases and self._releases[0].at < now - RELEASE_MEMORY:
            self._releases.popleft()
