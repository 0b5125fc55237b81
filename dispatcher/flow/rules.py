"""Flow rules: what an operator holds back at dispatch, per routing key or routing-key prefix,
optionally within one namespace.

A rule's ``key`` names a routing key and everything below it, word by word (``billing`` governs
``billing`` and ``billing.invoice``, never ``billingx``: ``api_keys.within``). Of one owner's
rules, the one that governs a job is the one with the longest key among those matching it;
between two with the same key, the one naming the job's namespace before the one for every
namespace. Only that rule of that owner applies: an operator's rule on ``billing.urgent`` that
pauses nothing lets its jobs go while the operator's ``billing`` is paused.

Each rule has an owner (``Owner``): the *operator* (an admin key set it last) or the *tenant* of
its namespace (that namespace's ``limits`` key set it). A tenant's key may not change, pause,
resume or delete an operator's rule (``api.limits``, 403), and its rules can only hold more, never
release what an operator's rule holds. The two owners' governing rules are weighed together; the
first of these decides a job's fate (``RuleBook.governing``):

1. the operator's, if it holds the job (paused);
2. the tenant's, if it holds it (a tenant may pause what an operator meters);
3. the operator's, if it meters the job (its meter alone lets it go: a tenant's meter under an
   operator's does not apply, the operator's pace does);
4. the tenant's, if it meters the job.

So a job is held whenever either owner's governing rule holds or meters it, and a tenant's
longer key never shadows an operator's: a tenant's rate on ``billing.invoice`` while the operator
has paused ``billing`` leaves ``billing.invoice`` paused.

A paused rule holds its jobs until resumed, or until ``paused_until``. A metered rule lets them
go at most ``rate_per_s`` a second (in bursts of ``burst``) and at most ``max_in_flight`` at a
time, cluster-wide (``flow.meter``). A held or metered job stays ``scheduled``: the node's loads
and claims pass over it (``HeldKeys``, evaluated in SQL by ``dispatcher_flow_held``, which a test
pins to ``RuleBook.holds``), so it neither sits in memory nor reaches the broker, until the meter
lets it go (a paused rule's, when the pause ends).

Pure: no I/O; the caller passes the time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from consumers_sdk import validation
from dispatcher.auth.api_keys import within, words

# A key is a routing key's words: at most this long (the broker's own limit on routing keys).
MAX_KEY_LENGTH = 255
MAX_NOTE_LENGTH = 500
MAX_RATE_PER_S = 100_000.0  # beyond what the broker confirms: a rate that high limits nothing
MAX_COUNT = 1_000_000  # a burst, a number in flight
MAX_IN_FLIGHT_TIMEOUT_S = 7 * 86_400.0
DEFAULT_IN_FLIGHT_TIMEOUT_S = 300.0
# A burst unspecified is a tenth of a second's worth: a meter that looks every 50 ms keeps the
# rate, and a key let go after a quiet spell sends no more than that at once.
DEFAULT_BURST_S = 0.1


class RuleRefused(ValueError):
    """A rule that cannot be stored; ``field`` names what is wrong (the API's 422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What a rule holds back: paused (until resumed, or until ``paused_until``); metered, at
    most ``rate_per_s`` a second in bursts of ``burst``, at most ``max_in_flight`` let go and not
    finished (a silent job's slot given back after ``in_flight_timeout_s``). A paused rule that
    meters too meters once its pause ends."""

    paused: bool = False
    paused_until: datetime | None = None
    note: str | None = None  # why, for the next operator (shown in listings)
    rate_per_s: float | None = None
    burst: int | None = None
    max_in_flight: int | None = None
    in_flight_timeout_s: float | None = None

    def holds_at(self, now: datetime) -> bool:
        """Whether the rule holds all its jobs at ``now`` (paused)."""
        return self.paused and (self.paused_until is None or now < self.paused_until)

    @property
    def meters(self) -> bool:
        """Whether the rule lets its jobs go by a rate or a number in flight."""
        return self.rate_per_s is not None or self.max_in_flight is not None

    def restrains_at(self, now: datetime) -> bool:
        """Whether no job of the rule goes at ``now`` unless the meter lets it go."""
        return self.meters or self.holds_at(now)

    def meters_at(self, now: datetime) -> bool:
        """Whether the meter lets the rule's jobs go at ``now`` (metered, not paused)."""
        return self.meters and not self.holds_at(now)


def check_key(key: str) -> str:
    """The key as stored (trailing dots dropped: ``billing.`` and ``billing`` are one key), or
    ``RuleRefused`` naming ``key``."""
    stored = words(key)
    if not stored:
        raise RuleRefused("key", "a rule's key names a routing key or a prefix of words")
    if len(stored) > MAX_KEY_LENGTH:
        raise RuleRefused("key", f"a rule's key is at most {MAX_KEY_LENGTH} characters")
    if not validation.ROUTING_KEY.fullmatch(stored):
        raise RuleRefused(
            "key", "a rule's key is words of letters, digits, '_', '-' or ':' joined by dots"
        )
    return stored


def check(limits: Limits, now: datetime) -> Limits:
    """``limits`` if storable at ``now``, the meter's defaults filled in; else ``RuleRefused``
    naming the field. A rule must be able to hold something back, and to let it go again by
    itself or when resumed."""
    _check_pause(limits, now)
    limits = _check_in_flight(_check_rate(limits))
    if not limits.paused and not limits.meters:
        raise RuleRefused(
            "paused",
            "a rule that is not paused, with no rate_per_s or max_in_flight, holds nothing",
        )
    if limits.note is not None and len(limits.note) > MAX_NOTE_LENGTH:
        raise RuleRefused("note", f"a note is at most {MAX_NOTE_LENGTH} characters")
    return limits


def _check_pause(limits: Limits, now: datetime) -> None:
    if limits.paused_until is not None:
        if limits.paused_until.tzinfo is None:
            raise RuleRefused("paused_until", "paused_until needs a time zone")
        if not limits.paused:
            raise RuleRefused("paused_until", "paused_until is for a paused rule")
        if limits.paused_until <= now:
            raise RuleRefused("paused_until", "paused_until is already past")


def _check_rate(limits: Limits) -> Limits:
    if limits.rate_per_s is None:
        if limits.burst is not None:
            raise RuleRefused("burst", "burst is for a rule with a rate_per_s")
        return limits
    if not math.isfinite(limits.rate_per_s) or not 0 < limits.rate_per_s <= MAX_RATE_PER_S:
        raise RuleRefused("rate_per_s", f"rate_per_s is above 0, at most {MAX_RATE_PER_S:g}")
    if limits.burst is None:
        burst = max(1, math.ceil(limits.rate_per_s * DEFAULT_BURST_S))
        return dataclasses.replace(limits, burst=burst)
    if not 1 <= limits.burst <= MAX_COUNT:
        raise RuleRefused("burst", f"burst is 1 to {MAX_COUNT}")
    return limits


def _check_in_flight(limits: Limits) -> Limits:
    if limits.max_in_flight is None:
        if limits.in_flight_timeout_s is not None:
            raise RuleRefused("in_flight_timeout_s", "in_flight_timeout_s is for a max_in_flight")
        return limits
    if not 1 <= limits.max_in_flight <= MAX_COUNT:
        raise RuleRefused("max_in_flight", f"max_in_flight is 1 to {MAX_COUNT}")
    timeout_s = limits.in_flight_timeout_s
    if timeout_s is None:
        return dataclasses.replace(limits, in_flight_timeout_s=DEFAULT_IN_FLIGHT_TIMEOUT_S)
    if not math.isfinite(timeout_s) or not 0 < timeout_s <= MAX_IN_FLIGHT_TIMEOUT_S:
        raise RuleRefused(
            "in_flight_timeout_s",
            f"in_flight_timeout_s is above 0, at most {MAX_IN_FLIGHT_TIMEOUT_S:g} (a week)",
        )
    return limits


class Owner(StrEnum):
    """Whom a rule answers to (see the module's docstring)."""

    OPERATOR = "operator"  # set last by an admin key
    TENANT = "tenant"  # set by its namespace's limits key


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    key: str
    namespace: str | None  # None: every namespace; "": the default namespace
    limits: Limits
    updated_at: datetime
    owner: Owner = Owner.OPERATOR

    def matches(self, routing_key: str, namespace: str) -> bool:
        return within(routing_key, self.key) and self.namespace in (None, namespace)


EVERY_NAMESPACE = "*"  # a rule for every namespace, in ``HeldKeys.weighed`` (never a namespace)
# What the meter's look is told of a rule that is not one of those it meters
# (``RuleBook.governing_tags``): it holds its jobs, or it restrains nothing.
TAG_HOLDS = -1
TAG_FREE = -2


def prefixes(key: str) -> Iterator[str]:
    """``key`` and each shorter prefix of its words, longest first: ``a.b``, then ``a``."""
    prefix = key
    while True:
        yield prefix
        cut = prefix.rfind(".")
        if cut < 0:
            return
        prefix = prefix[:cut]


def _place(rule: Rule) -> str:
    return EVERY_NAMESPACE if rule.namespace is None else rule.namespace


class _Layer:
    """One owner's rules by key: the one governing a job is looked up by the words of its routing
    key (a few dictionary lookups, whatever the number of rules)."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        self._by_key: dict[str, dict[str | None, Rule]] = {}
        for rule in self.rules:
            self._by_key.setdefault(rule.key, {})[rule.namespace] = rule

    def governing(self, routing_key: str, namespace: str | None) -> Rule | None:
        """The longest key first, then the one naming the namespace (None or "": the default)."""
        if not self._by_key:
            return None
        for prefix in prefixes(routing_key):
            by_namespace = self._by_key.get(prefix)
            if by_namespace is not None:
                rule = by_namespace.get(namespace or "") or by_namespace.get(None)
                if rule is not None:
                    return rule
        return None

    def below(self, keys: Set[str]) -> list[Rule]:
        """The rules whose key is one of ``keys`` or below one: each rule's prefixes looked up,
        linear in the number of rules."""
        if not keys:
            return []
        return [rule for rule in self.rules if any(p in keys for p in prefixes(rule.key))]

    def above(self, keys: Iterable[str]) -> list[Rule]:
        """The rules whose key is one of ``keys`` or a prefix of one."""
        above = {prefix for key in keys for prefix in prefixes(key)}
        return [rule for rule in self.rules if rule.key in above]


@dataclass(frozen=True, slots=True)
class HeldKeys:
    """The rules the node's SQL must weigh to tell a held job (``dispatcher_flow_held``), each
    owner's apart, as ``{owner: {key: {namespace or "*": held}}}``: every rule that holds, and
    every rule that does not but governs jobs below one of its owner's that does (an owner with
    none left out); and their keys' first words (a job whose routing key starts with none of them
    is not held, and the SQL tells so without calling the function). Empty when nothing is held
    (the queries skip the test)."""

    weighed: dict[str, dict[str, dict[str, bool]]] = field(default_factory=dict)
    first_words: list[str] = field(default_factory=list)
    rules_json: str = "{}"  # ``weighed`` as the jsonb the function reads
    keys: frozenset[str] = frozenset()  # every weighed rule's key

    @classmethod
    def of(cls, layers: Mapping[Owner, Iterable[Rule]], now: datetime) -> HeldKeys:
        weighed: dict[str, dict[str, dict[str, bool]]] = {}
        for owner, weighed_rules in layers.items():
            by_key: dict[str, dict[str, bool]] = {}
            for rule in weighed_rules:
                by_key.setdefault(rule.key, {})[_place(rule)] = rule.limits.restrains_at(now)
            if by_key:
                weighed[owner.value] = by_key
        keys = frozenset(key for by_key in weighed.values() for key in by_key)
        return cls(
            weighed=weighed,
            first_words=sorted({key.split(".", 1)[0] for key in keys}),
            rules_json=json.dumps(weighed, sort_keys=True, separators=(",", ":")),
            keys=keys,
        )

    def __bool__(self) -> bool:
        return bool(self.weighed)

    def may_hold(self, routing_key: str) -> bool:
        """Whether some weighed rule matches ``routing_key`` (an unknown key, "", may be held):
        when none does, no job of that key is held, in any namespace, and the SQL need not ask."""
        if not routing_key:
            return bool(self.weighed)
        return any(prefix in self.keys for prefix in prefixes(routing_key))

    def held_count(self) -> int:
        return sum(
            held
            for by_key in self.weighed.values()
            for by_namespace in by_key.values()
            for held in by_namespace.values()
        )


NOTHING_HELD = HeldKeys()


class RuleBook:
    """Every rule, as last read from PostgreSQL, each owner's found by key. Each question is
    linear in the number of rules at most (a job's rule: a few lookups), never a rule against
    every other: the node asks them on its event loop, at every change, with thousands of rules."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self._rules = sorted(rules, key=lambda rule: (rule.key, rule.namespace or ""))
        self._layers = {
            owner: _Layer(rule for rule in self._rules if rule.owner is owner) for owner in Owner
        }

    def __iter__(self) -> Iterator[Rule]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def governing(self, routing_key: str, namespace: str | None, now: datetime) -> Rule | None:
        """The rule that decides for jobs of ``routing_key`` in ``namespace`` (None or "" the
        default) at ``now``, of the rule each owner has governing them: the operator's if it
        holds them, the tenant's if it does, the operator's if it meters them, the tenant's if
        it does; else one that restrains nothing (the operator's first), if any."""
        found = [
            rule
            for owner in Owner  # the operator's first
            if (rule := self._layers[owner].governing(routing_key, namespace)) is not None
        ]
        for rule in found:
            if rule.limits.holds_at(now):
                return rule
        for rule in found:
            if rule.limits.meters:
                return rule
        return found[0] if found else None

    def holds(self, routing_key: str, namespace: str | None, now: datetime) -> Rule | None:
        """The rule holding such a job back at ``now`` (paused, or metered), if one does."""
        rule = self.governing(routing_key, namespace, now)
        return rule if rule is not None and rule.limits.restrains_at(now) else None

    def holding(self, now: datetime) -> HeldKeys:
        """What the SQL needs to tell held jobs at ``now`` (``HeldKeys``): a metered rule's jobs
        are held too, but for those its meter lets go."""
        layers = {
            owner: layer.below({rule.key for rule in layer.rules if rule.limits.restrains_at(now)})
            for owner, layer in self._layers.items()
        }
        if not any(layers.values()):
            return NOTHING_HELD
        return HeldKeys.of(layers, now)

    def metered(self, now: datetime) -> list[Rule]:
        """The rules whose meter lets their jobs go at ``now`` (metered, not paused)."""
        return [rule for rule in self._rules if rule.limits.meters_at(now)]

    def governing_tags(self, metered: Sequence[Rule], now: datetime) -> str:
        """For the meter's look (``queries.flow_rules.METERED_DUE``), each owner's apart as
        ``{owner: {key: {namespace or "*": tag}}}``: each rule of ``metered`` tagged with its
        index; every other rule that may govern a job one of them matches (its key below one of
        theirs, or above) ``TAG_HOLDS`` if it holds at ``now``, else ``TAG_FREE``; as jsonb
        text. ``dispatcher_flow_meter_tag`` picks a job's tag as ``governing`` picks its rule."""
        index = {(rule.key, rule.namespace, rule.owner): tag for tag, rule in enumerate(metered)}
        keys = {rule.key for rule in metered}
        tags: dict[str, dict[str, dict[str, int]]] = {}
        for owner, layer in self._layers.items():
            by_key: dict[str, dict[str, int]] = {}
            for rule in [*layer.below(keys), *layer.above(keys)]:
                tag = index.get((rule.key, rule.namespace, rule.owner))
                if tag is None:
                    tag = TAG_HOLDS if rule.limits.holds_at(now) else TAG_FREE
                by_key.setdefault(rule.key, {})[_place(rule)] = tag
            if by_key:
                tags[owner.value] = by_key
        return json.dumps(tags, sort_keys=True, separators=(",", ":"))

    def next_change(self, now: datetime) -> datetime | None:
        """The next instant a rule stops holding by itself (its ``paused_until``), if any."""
        ends = [
            rule.limits.paused_until
            for rule in self._rules
            if rule.limits.paused_until is not None and rule.limits.holds_at(now)
        ]
        return min(ends, default=None)

    def counts(self, now: datetime) -> dict[str, int]:
        """How many rules there are of each kind, for the metrics."""
        return {
            "paused": sum(1 for rule in self._rules if rule.limits.holds_at(now)),
            "rate": sum(1 for rule in self._rules if rule.limits.rate_per_s is not None),
            "in_flight": sum(1 for rule in self._rules if rule.limits.max_in_flight is not None),
        }
