"""Flow rules: what an operator holds back at dispatch, per routing key or routing-key prefix,
optionally within one namespace.

A rule's ``key`` names a routing key and everything below it, word by word (``billing`` governs
``billing`` and ``billing.invoice``, never ``billingx``: ``api_keys.within``). The rule that
governs a job is the one with the longest key among those matching it; between two with the same
key, the one naming the job's namespace before the one for every namespace. Only that rule
applies: a rule on ``billing.urgent`` that pauses nothing lets its jobs go while ``billing`` is
paused.

A paused rule holds its jobs until resumed, or until ``paused_until``. A held job stays
``scheduled``: the node's loads and claims pass over it (``HeldKeys``, evaluated in SQL), so it
neither sits in memory nor reaches the broker.

Pure: no I/O; the caller passes the time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from consumers_sdk import validation
from dispatcher.api_keys import within, words

# A key is a routing key's words: at most this long (the broker's own limit on routing keys).
MAX_KEY_LENGTH = 255
MAX_NOTE_LENGTH = 500


class RuleRefused(ValueError):
    """A rule that cannot be stored; ``field`` names what is wrong (the API's 422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What a rule holds back: paused (until resumed, or until ``paused_until``)."""

    paused: bool = False
    paused_until: datetime | None = None
    note: str | None = None  # why, for the next operator (shown in listings)

    def holds_at(self, now: datetime) -> bool:
        """Whether the rule holds its jobs at ``now``."""
        return self.paused and (self.paused_until is None or now < self.paused_until)


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
    """``limits`` if storable at ``now``; else ``RuleRefused`` naming the field. A rule must be
    able to hold something back, and to let it go again by itself or when resumed."""
    if limits.paused_until is not None:
        if limits.paused_until.tzinfo is None:
            raise RuleRefused("paused_until", "paused_until needs a time zone")
        if not limits.paused:
            raise RuleRefused("paused_until", "paused_until is for a paused rule")
        if limits.paused_until <= now:
            raise RuleRefused("paused_until", "paused_until is already past")
    if not limits.paused:
        raise RuleRefused("paused", "a rule that is not paused holds nothing back")
    if limits.note is not None and len(limits.note) > MAX_NOTE_LENGTH:
        raise RuleRefused("note", f"a note is at most {MAX_NOTE_LENGTH} characters")
    return limits


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    key: str
    namespace: str | None  # None: every namespace; "": the default namespace
    limits: Limits
    updated_at: datetime

    def matches(self, routing_key: str, namespace: str) -> bool:
        return within(routing_key, self.key) and self.namespace in (None, namespace)


EVERY_NAMESPACE = "*"  # a rule for every namespace, in ``HeldKeys.weighed`` (never a namespace)


@dataclass(frozen=True, slots=True)
class HeldKeys:
    """The rules the node's SQL must weigh to tell a held job (``dispatcher_held``): every rule
    that holds, and every rule that does not but governs jobs below one that does, as
    ``{key: {namespace or "*": held}}``; and their keys' first words (a job whose routing key
    starts with none of them is not held, and the SQL tells so without calling the function).
    Empty when nothing is held (the queries skip the test)."""

    weighed: dict[str, dict[str, bool]] = field(default_factory=dict)
    first_words: list[str] = field(default_factory=list)
    rules_json: str = "{}"  # ``weighed`` as the jsonb the function reads

    @classmethod
    def of(cls, rules: Iterable[Rule], now: datetime) -> HeldKeys:
        weighed: dict[str, dict[str, bool]] = {}
        for rule in rules:
            namespace = EVERY_NAMESPACE if rule.namespace is None else rule.namespace
            weighed.setdefault(rule.key, {})[namespace] = rule.limits.holds_at(now)
        return cls(
            weighed=weighed,
            first_words=sorted({key.split(".", 1)[0] for key in weighed}),
            rules_json=json.dumps(weighed, sort_keys=True, separators=(",", ":")),
        )

    def __bool__(self) -> bool:
        return bool(self.weighed)

    def may_hold(self, routing_key: str) -> bool:
        """Whether some weighed rule matches ``routing_key`` (an unknown key, "", may be held):
        when none does, no job of that key is held, in any namespace, and the SQL need not ask."""
        if not routing_key:
            return bool(self.weighed)
        prefix = routing_key
        while prefix not in self.weighed:
            cut = prefix.rfind(".")
            if cut < 0:
                return False
            prefix = prefix[:cut]
        return True

    def held_count(self) -> int:
        return sum(held for by_namespace in self.weighed.values() for held in by_namespace.values())


NOTHING_HELD = HeldKeys()


class RuleBook:
    """Every rule, as last read from PostgreSQL, found by key: a job's governing rule is looked up
    by the words of its routing key (a few dictionary lookups, whatever the number of rules)."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self._rules = sorted(rules, key=lambda rule: (rule.key, rule.namespace or ""))
        self._by_key: dict[str, list[Rule]] = {}
        for rule in self._rules:
            self._by_key.setdefault(rule.key, []).append(rule)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def governing(self, routing_key: str, namespace: str | None) -> Rule | None:
        """The rule that governs jobs of ``routing_key`` in ``namespace`` (None or "" the
        default), if any: the longest key first, then the one naming the namespace."""
        if not self._by_key:
            return None
        ns = namespace or ""
        prefix = routing_key
        while True:
            every: Rule | None = None
            for rule in self._by_key.get(prefix, ()):
                if rule.namespace == ns:
                    return rule
                if rule.namespace is None:
                    every = rule
            if every is not None:
                return every
            cut = prefix.rfind(".")
            if cut < 0:
                return None
            prefix = prefix[:cut]

    def holds(self, routing_key: str, namespace: str | None, now: datetime) -> Rule | None:
        """The rule holding such a job at ``now``, if one does."""
        rule = self.governing(routing_key, namespace)
        return rule if rule is not None and rule.limits.holds_at(now) else None

    def holding(self, now: datetime) -> HeldKeys:
        """What the SQL needs to tell held jobs at ``now`` (``HeldKeys``)."""
        holding = [rule for rule in self._rules if rule.limits.holds_at(now)]
        if not holding:
            return NOTHING_HELD
        weighed = [
            rule
            for rule in self._rules
            if rule.limits.holds_at(now) or any(within(rule.key, h.key) for h in holding)
        ]
        return HeldKeys.of(weighed, now)

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
        return {"paused": sum(1 for rule in self._rules if rule.limits.holds_at(now))}
