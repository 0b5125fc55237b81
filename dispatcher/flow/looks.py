"""What the flow meter looks for, and from where (``flow.meter`` does the looking). Pure: no I/O;
the times are passed in.

A *busy* rule (it had jobs due at its last look) is looked at every tick, from its floor: the
run_at of the oldest job it found last, so a key's backlog is walked from its head. A rule whose
look found nothing is *quiet*: the quiet rules are looked at together every ``QUIET_S``, one walk
of the due index from where the last walk ended (less ``QUIET_MARGIN``, for jobs committed
late), which tells which of them have jobs due; those are busy again, from the walk's start
(they had none due before it). Looking at each quiet rule apart would walk the index once per
rule. A job stored behind the walk (due before it, committed after it) is offered by intake or a
due notice, which moves the walk back to it; a whole walk, from the beginning, every
``RESCAN_S`` and after every change of the rules or of the shards owned, finds what was missed
otherwise.

A job let go and not yet claimed is not asked for again for ``PENDING_S`` (its token is spent
once); one that never fired (its node died) is asked for again after that, and keeps its slot.

The interface::

    MeterLooks()
    start(shards, metered, tags, now_mono) -> bool     # False: nothing to meter (all forgotten)
    offered(entries) -> None                           # jobs just stored or moved
    walk_from(now_mono) -> datetime | None             # a walk for quiet rules is due: its start
    quiet_first_words: list[str]                       # what the walk weighs
    walked(since, looked_at, woken) -> None            # what it found (places in ``metered``)
    looks() -> list[MeteredLook]                       # the busy rules' looks
    found(look, entries, looked_at) -> list[DueEntry]  # what to ask the meter for
    granted(look, entries, now_mono) -> None           # what it let go
    tags: str                                          # ``RuleBook.governing_tags(metered)``

A tick costs what the busy rules and the jobs let go cost, not the number of rules metered: those
are weighed once per change (a node may meter thousands).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dispatcher.flow.rules import Rule
from dispatcher.models import DueEntry

QUIET_S = 0.1
QUIET_MARGIN = timedelta(seconds=0.05)
RESCAN_S = 30.0
PENDING_S = 10.0
# At most this many jobs of one rule are asked for in one look (a rule without a rate wants as
# many as it has slots).
MOST_WANTED = 500
BEGINNING = datetime(1, 1, 2, tzinfo=UTC)

RuleId = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class MeteredLook:
    """One busy rule's look (``tag``: its place in ``metered``, as the governing tags name it):
    up to ``wanted`` due jobs of run_at ``floor`` or later."""

    rule: Rule
    tag: int
    wanted: int
    floor: datetime


def wanted(rule: Rule) -> int:
    """How many jobs one look asks for: a burst's worth, and no more than the slots."""
    limits = rule.limits
    most = MOST_WANTED
    if limits.burst is not None:
        most = min(most, limits.burst)
    if limits.max_in_flight is not None:
        most = min(most, limits.max_in_flight)
    return max(1, most)


class MeterLooks:
    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self._metered: tuple[Rule, ...] = ()
        self._seen: Sequence[Rule] | None = None  # the list ``_metered`` was last told as
        self._tag_of: dict[RuleId, int] = {}  # each metered rule's place in ``_metered``
        self._quiet_words: list[str] | None = None  # ``quiet_first_words``, until busy changes
        self._shards: frozenset[int] = frozenset()
        self._keys: frozenset[str] = frozenset()
        self.tags = "{}"
        self._busy: dict[RuleId, datetime] = {}  # the busy rules, and their floors
        self._walk_since = BEGINNING  # the next walk for quiet rules starts here
        self._walk_at = 0.0  # (monotonic) the next walk for quiet rules
        # The earliest job offered since the walk under way began: its snapshot may not have
        # seen it (an offer comes after the commit), so the walk's end keeps the next one there.
        self._offered_since: datetime | None = None
        self._rescan_at = 0.0
        # The rules with jobs let go and not yet claimed: those jobs, and when.
        self._pending: dict[RuleId, dict[uuid.UUID, float]] = {}

    def start(
        self, shards: frozenset[int], metered: Sequence[Rule], tags: str, now_mono: float
    ) -> bool:
        """Begin a tick with the shards owned, the rules metering now and their tags
        (``RuleBook.governing_tags``); False when there is nothing to meter. Any change of them,
        or ``RESCAN_S`` gone by, starts a whole walk."""
        if not metered or not shards:
            self._forget()  # the next start is afresh
            return False
        changed = (shards, tags) != (self._shards, self.tags) or (
            metered is not self._seen and tuple(metered) != self._metered
        )
        self._seen = metered
        if changed:
            self._shards, self._metered, self.tags = shards, tuple(metered), tags
            self._tag_of = {_id(rule): tag for tag, rule in enumerate(metered)}
            self._keys = frozenset(rule.key for rule in metered)
            self._pending = {
                rule_id: jobs for rule_id, jobs in self._pending.items() if rule_id in self._tag_of
            }
        if changed or now_mono >= self._rescan_at:
            self._busy.clear()
            self._quiet_words = None
            self._walk_since, self._walk_at = BEGINNING, 0.0
            self._rescan_at = now_mono + RESCAN_S
        self._pending = {
            rule_id: kept
            for rule_id, jobs in self._pending.items()
            if (kept := {job_id: at for job_id, at in jobs.items() if now_mono - at < PENDING_S})
        }
        return True

    def offered(self, entries: Iterable[DueEntry]) -> None:
        """Jobs just stored or moved: one a metered rule may govern (its key unknown, "", may
        be) moves the next walk back to it, at once."""
        if not self._keys:
            return
        for entry in entries:
            if _may_meter(entry.key, self._keys):
                at = max(BEGINNING, datetime.fromtimestamp(entry.run_at_s, UTC) - QUIET_MARGIN)
                self._walk_since = min(self._walk_since, at)
                self._offered_since = min(self._offered_since or at, at)
                self._walk_at = 0.0

    def walk_from(self, now_mono: float) -> datetime | None:
        """The start of the walk for quiet rules, when one is due and a rule is quiet."""
        if now_mono < self._walk_at:
            return None
        self._walk_at = now_mono + QUIET_S
        if len(self._busy) >= len(self._metered):  # every rule busy: none is quiet
            return None
        self._offered_since = None  # what was offered so far, this walk sees (committed)
        return self._walk_since

    @property
    def quiet_first_words(self) -> list[str]:
        """The first words of the quiet rules' keys (the walk passes over other jobs)."""
        if self._quiet_words is None:
            self._quiet_words = sorted(
                {rule.key.split(".", 1)[0] for rule in self._metered if _id(rule) not in self._busy}
            )
        return self._quiet_words

    def walked(self, since: datetime, looked_at: datetime, woken: Iterable[int]) -> None:
        """The walk from ``since`` made at ``looked_at`` found jobs of the rules ``woken`` (their
        places in ``metered``): they are busy, from ``since``. A job offered while it was under
        way keeps the next walk at it, at once."""
        self._walk_since = max(BEGINNING, looked_at - QUIET_MARGIN)
        if self._offered_since is not None:
            self._walk_since = min(self._walk_since, self._offered_since)
            self._walk_at = 0.0
            self._offered_since = None
        for tag in woken:
            if 0 <= tag < len(self._metered) and _id(self._metered[tag]) not in self._busy:
                self._busy[_id(self._metered[tag])] = since
                self._quiet_words = None

    def looks(self) -> list[MeteredLook]:
        """The busy rules' looks, each for a burst's worth beyond what it let go and not yet
        claimed."""
        busy = sorted((self._tag_of[rule_id], floor) for rule_id, floor in self._busy.items())
        return [
            MeteredLook(
                rule=(rule := self._metered[tag]),
                tag=tag,
                wanted=wanted(rule) + len(self._pending.get(_id(rule), ())),
                floor=floor,
            )
            for tag, floor in busy
        ]

    def found(
        self, look: MeteredLook, entries: Sequence[DueEntry], looked_at: datetime
    ) -> list[DueEntry]:
        """What to ask the meter for, of what ``look`` found (oldest first); none found: the rule
        is quiet, and the next walk takes it from the time of the look."""
        rule_id = _id(look.rule)
        if not entries:
            if self._busy.pop(rule_id, None) is not None:
                self._quiet_words = None
            self._walk_since = min(self._walk_since, looked_at - QUIET_MARGIN)
            return []
        if rule_id not in self._busy:
            self._quiet_words = None
        self._busy[rule_id] = datetime.fromtimestamp(entries[0].run_at_s, UTC)
        pending = self._pending.get(rule_id, {})
        return [entry for entry in entries if entry.id not in pending][: wanted(look.rule)]

    def granted(self, look: MeteredLook, entries: Iterable[DueEntry], now_mono: float) -> None:
        """These were let go: not asked for again for ``PENDING_S``."""
        self._pending.setdefault(_id(look.rule), {}).update(
            (entry.id, now_mono) for entry in entries
        )


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
