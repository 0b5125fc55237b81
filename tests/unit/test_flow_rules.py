"""Which flow rule governs a job, what the SQL is told is held, and what a rule may be."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.flow import looks
from dispatcher.flow.rules import (
    TAG_FREE,
    TAG_HOLDS,
    Limits,
    Owner,
    Rule,
    RuleBook,
    RuleRefused,
    check,
    check_key,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PAUSED = Limits(paused=True)


def rule(key: str, namespace: str | None = None, limits: Limits = PAUSED) -> Rule:
    return Rule(key=key, namespace=namespace, limits=limits, updated_at=NOW)


def test_the_longest_key_matching_word_by_word_governs() -> None:
    book = RuleBook([rule("billing"), rule("billing.invoice"), rule("bill")])
    assert book.governing("billing.invoice.send", None, NOW) == rule("billing.invoice")
    assert book.governing("billing.refund", None, NOW) == rule("billing")
    assert book.governing("billing", None, NOW) == rule("billing")
    assert book.governing("billingx.invoice", None, NOW) is None  # words, not characters
    assert book.governing("bill.x", None, NOW) == rule("bill")
    assert book.governing("other", None, NOW) is None


def test_a_rule_naming_the_jobs_namespace_governs_before_one_for_every_namespace() -> None:
    every, own = rule("billing"), rule("billing", "shop")
    book = RuleBook([every, own])
    assert book.governing("billing.x", "shop", NOW) == own
    assert book.governing("billing.x", "other", NOW) == every
    assert book.governing("billing.x", None, NOW) == every
    # The default namespace is named "" by a rule, None or "" by a job.
    default = rule("billing", "")
    assert RuleBook([default]).governing("billing", None, NOW) == default
    assert RuleBook([default]).governing("billing", "shop", NOW) is None
    # A longer key wins even for every namespace.
    longer = rule("billing.x")
    assert RuleBook([own, longer]).governing("billing.x", "shop", NOW) == longer


def test_a_pause_holds_until_its_end_and_the_sql_is_told_so() -> None:
    until = NOW + timedelta(minutes=5)
    book = RuleBook([rule("a", limits=Limits(paused=True, paused_until=until)), rule("b")])
    assert book.holds("a.x", None, NOW) is not None
    assert book.holds("a.x", None, until) is None
    held = book.holding(NOW)
    assert held.weighed == {"operator": {"a": {"*": True}, "b": {"*": True}}}
    assert book.next_change(NOW) == until
    assert book.holding(until).weighed == {"operator": {"b": {"*": True}}}
    assert book.next_change(until) is None
    assert book.counts(NOW) == {"paused": 2, "rate": 0, "in_flight": 0}


def test_nothing_is_weighed_while_nothing_holds() -> None:
    assert not RuleBook().holding(NOW)
    released = Limits(paused=True, paused_until=NOW)
    assert not RuleBook([rule("a", limits=released)]).holding(NOW)


def test_a_rule_below_a_held_one_is_weighed_so_it_can_let_its_jobs_go() -> None:
    free = Limits(paused=False)
    book = RuleBook(
        [rule("billing"), rule("billing.urgent", limits=free), rule("other", limits=free)]
    )
    held = book.holding(NOW)
    assert held.weighed == {"operator": {"billing": {"*": True}, "billing.urgent": {"*": False}}}
    assert held.first_words == ["billing"]
    assert held.rules_json == ('{"operator":{"billing":{"*":true},"billing.urgent":{"*":false}}}')
    assert book.holds("billing.urgent.x", None, NOW) is None
    assert book.holds("billing.late", None, NOW) == rule("billing")


@pytest.mark.parametrize(
    ("key", "stored"), [("billing", "billing"), ("billing.", "billing"), ("a.b-c:d_e", "a.b-c:d_e")]
)
def test_a_key_is_stored_as_its_words(key: str, stored: str) -> None:
    assert check_key(key) == stored


@pytest.mark.parametrize("key", ["", ".", "a..b", ".a", "a b", "a\nb", "é", "a" * 256, "a.*"])
def test_a_key_that_names_no_words_is_refused_naming_the_key(key: str) -> None:
    with pytest.raises(RuleRefused) as refused:
        check_key(key)
    assert refused.value.field == "key"


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        (Limits(paused=False), "paused"),
        (Limits(paused=True, paused_until=NOW), "paused_until"),
        (Limits(paused=True, paused_until=NOW - timedelta(seconds=1)), "paused_until"),
        (Limits(paused=False, paused_until=NOW + timedelta(hours=1)), "paused_until"),
        (Limits(paused=True, paused_until=datetime(2027, 1, 1)), "paused_until"),
        (Limits(paused=True, note="x" * 501), "note"),
        (Limits(rate_per_s=0), "rate_per_s"),
        (Limits(rate_per_s=-1), "rate_per_s"),
        (Limits(rate_per_s=100_000.5), "rate_per_s"),
        (Limits(rate_per_s=float("nan")), "rate_per_s"),
        (Limits(rate_per_s=float("inf")), "rate_per_s"),
        (Limits(paused=True, burst=5), "burst"),
        (Limits(rate_per_s=10, burst=0), "burst"),
        (Limits(rate_per_s=10, burst=1_000_001), "burst"),
        (Limits(max_in_flight=0), "max_in_flight"),
        (Limits(max_in_flight=1_000_001), "max_in_flight"),
        (Limits(paused=True, in_flight_timeout_s=60), "in_flight_timeout_s"),
        (Limits(max_in_flight=5, in_flight_timeout_s=0), "in_flight_timeout_s"),
        (Limits(max_in_flight=5, in_flight_timeout_s=604_800.5), "in_flight_timeout_s"),
        (Limits(max_in_flight=5, in_flight_timeout_s=float("nan")), "in_flight_timeout_s"),
        (Limits(paused=False, note="meters nothing"), "paused"),
    ],
)
def test_a_rule_that_holds_nothing_or_never_lets_go_is_refused_naming_the_field(
    limits: Limits, field: str
) -> None:
    with pytest.raises(RuleRefused) as refused:
        check(limits, NOW)
    assert refused.value.field == field


def test_a_pause_until_resumed_or_until_a_later_instant_is_accepted() -> None:
    assert check(PAUSED, NOW) == PAUSED
    later = Limits(paused=True, paused_until=NOW + timedelta(seconds=1), note="db migration")
    assert check(later, NOW) == later


def test_a_key_no_weighed_rule_matches_is_known_free_without_asking_the_sql() -> None:
    held = RuleBook([rule("billing.card"), rule("mail", "shop")]).holding(NOW)
    assert held.may_hold("billing.card")
    assert held.may_hold("billing.card.visa")
    assert held.may_hold("mail.send")  # held in one namespace: the SQL decides for the others
    assert not held.may_hold("billing")
    assert not held.may_hold("billing.cardx")
    assert not held.may_hold("other.card")
    assert held.may_hold("")  # a key unknown (a due notice without one)
    assert not RuleBook().holding(NOW).may_hold("")


@pytest.mark.parametrize(
    ("rate", "burst"), [(200, 20), (0.5, 1), (1, 1), (15, 2), (100_000, 10_000)]
)
def test_a_rate_without_a_burst_gets_a_tenth_of_a_seconds_worth_at_least_one(
    rate: float, burst: int
) -> None:
    assert check(Limits(rate_per_s=rate), NOW) == Limits(rate_per_s=rate, burst=burst)
    given = Limits(rate_per_s=rate, burst=3)
    assert check(given, NOW) == given


def test_a_number_in_flight_without_a_timeout_gets_five_minutes() -> None:
    assert check(Limits(max_in_flight=50), NOW) == Limits(
        max_in_flight=50, in_flight_timeout_s=300.0
    )
    given = Limits(max_in_flight=1, in_flight_timeout_s=604_800)
    assert check(given, NOW) == given


def test_a_paused_metered_rule_meters_once_its_pause_ends() -> None:
    until = NOW + timedelta(minutes=5)
    both = check(Limits(paused=True, paused_until=until, rate_per_s=10, max_in_flight=2), NOW)
    assert (both.burst, both.in_flight_timeout_s) == (1, 300.0)
    assert both.meters
    assert (both.holds_at(NOW), both.meters_at(NOW), both.restrains_at(NOW)) == (True, False, True)
    assert (both.holds_at(until), both.meters_at(until)) == (False, True)
    assert (PAUSED.meters, PAUSED.meters_at(NOW)) == (False, False)


def test_the_counts_tell_paused_rate_and_in_flight_rules_apart() -> None:
    until = NOW + timedelta(minutes=5)
    book = RuleBook(
        [
            rule("a"),
            rule("b", limits=Limits(paused=True, paused_until=until, rate_per_s=5, burst=1)),
            rule("c", limits=Limits(rate_per_s=5, burst=1, max_in_flight=3)),
            rule("d", limits=Limits(max_in_flight=3, in_flight_timeout_s=300)),
        ]
    )
    assert book.counts(NOW) == {"paused": 2, "rate": 2, "in_flight": 2}
    assert book.counts(until) == {"paused": 1, "rate": 2, "in_flight": 2}
    assert [r.key for r in book.metered(NOW)] == ["c", "d"]
    assert [r.key for r in book.metered(until)] == ["b", "c", "d"]


def test_a_metered_rule_holds_its_jobs_from_the_loads_and_meters_once_unpaused() -> None:
    until = NOW + timedelta(minutes=5)
    rate = Limits(rate_per_s=10.0, burst=1)
    both = Limits(paused=True, paused_until=until, max_in_flight=3, in_flight_timeout_s=60.0)
    book = RuleBook([rule("a", limits=rate), rule("b", limits=both), rule("a.free")])
    # The loads pass over both keys' jobs (a metered job goes only when its meter lets it go),
    # but not those of a rule below that neither pauses nor meters.
    assert book.holding(NOW).weighed == {
        "operator": {"a": {"*": True}, "a.free": {"*": True}, "b": {"*": True}}
    }
    assert book.holds("a.x", None, NOW) == rule("a", limits=rate)
    assert [r.key for r in book.metered(NOW)] == ["a"]  # b is paused: nothing to meter yet
    assert [r.key for r in book.metered(until)] == ["a", "b"]
    assert book.counts(NOW) == {"paused": 2, "rate": 1, "in_flight": 1}


def test_the_meters_look_is_told_which_rule_governs_each_key() -> None:
    metered = rule("a", limits=Limits(rate_per_s=5.0, burst=1))
    own = rule("a", "shop", limits=Limits(max_in_flight=2, in_flight_timeout_s=9.0))
    book = RuleBook([metered, own, rule("a.b"), rule("c")])
    # Each metered rule is tagged by its place; a rule below one of them, by whether it holds;
    # others left out.
    tags = json.loads(book.governing_tags([metered, own], NOW))
    assert tags == {"operator": {"a": {"*": 0, "shop": 1}, "a.b": {"*": TAG_HOLDS}}}


def test_a_look_asks_for_a_bursts_worth_and_no_more_than_the_slots() -> None:
    assert looks.wanted(rule("a", limits=Limits(rate_per_s=200.0, burst=20))) == 20
    assert looks.wanted(rule("a", limits=Limits(max_in_flight=5, in_flight_timeout_s=1.0))) == 5
    unbounded = Limits(rate_per_s=1e5, burst=100_000)
    assert looks.wanted(rule("a", limits=unbounded)) == looks.MOST_WANTED


def tenant(key: str, namespace: str, limits: Limits = PAUSED) -> Rule:
    return Rule(key=key, namespace=namespace, limits=limits, updated_at=NOW, owner=Owner.TENANT)


RATE = Limits(rate_per_s=5.0, burst=1)


def test_a_tenants_longer_rule_never_lifts_an_operators_hold() -> None:
    held = rule("billing")
    rated = tenant("billing.invoice", "a", RATE)
    book = RuleBook([held, rated])
    # The operator's pause holds the tenant's key, though the tenant's key is longer.
    assert book.holds("billing.invoice.send", "a", NOW) == held
    assert book.holds("billing.invoice", "b", NOW) == held
    assert book.metered(NOW) == [rated]  # its meter runs, and is told it governs nothing here
    tags = json.loads(book.governing_tags([rated], NOW))
    assert tags == {
        "operator": {"billing": {"*": TAG_HOLDS}},
        "tenant": {"billing.invoice": {"a": 0}},
    }
    # Both owners' rules are weighed apart by the SQL.
    assert book.holding(NOW).weighed == {
        "operator": {"billing": {"*": True}},
        "tenant": {"billing.invoice": {"a": True}},
    }
    # Once the operator's pause is gone, the tenant's rate governs its own key.
    assert RuleBook([rated]).holds("billing.invoice.send", "a", NOW) == rated


def test_a_tenants_pause_holds_below_an_operators_meter_and_its_meter_does_not() -> None:
    metered = rule("billing", limits=RATE)
    paused = tenant("billing.refund", "a")
    slower = tenant("billing.invoice", "a", Limits(rate_per_s=0.5, burst=1))
    book = RuleBook([metered, paused, slower])
    assert book.holds("billing.refund.x", "a", NOW) == paused  # holding more: allowed
    assert book.holds("billing.refund.x", "b", NOW) == metered
    assert book.holds("billing.invoice", "a", NOW) == metered  # the operator's pace applies
    tags = json.loads(book.governing_tags([metered, slower], NOW))
    assert tags["operator"] == {"billing": {"*": 0}}
    assert tags["tenant"] == {"billing.invoice": {"a": 1}, "billing.refund": {"a": TAG_HOLDS}}


def test_an_operators_rule_that_restrains_nothing_leaves_the_tenants_to_govern() -> None:
    ended = Limits(paused=True, paused_until=NOW - timedelta(seconds=1))
    free = rule("billing", limits=ended)
    paused = tenant("billing", "a")
    book = RuleBook([free, paused])
    assert book.holds("billing.x", "a", NOW) == paused
    assert book.holds("billing.x", "b", NOW) is None
    assert book.governing("billing.x", "b", NOW) == free
    above = tenant("mail", "a", ended)
    tags = json.loads(
        RuleBook([above, rule("mail.x", limits=RATE)]).governing_tags(
            [rule("mail.x", limits=RATE)], NOW
        )
    )
    assert tags == {"operator": {"mail.x": {"*": 0}}, "tenant": {"mail": {"a": TAG_FREE}}}


def test_ten_thousand_rules_are_weighed_in_well_under_a_second() -> None:
    # Before: each rule against every holding or metered one, about 25 s for these; linear now,
    # about 0.2 s. The bound is this process's CPU time, far above linear and far below quadratic,
    # so that other work on a loaded machine does not fail it.
    rules = [rule(f"t{n}", limits=RATE) for n in range(100)]
    rules += [rule(f"t{n % 100}.k{n}", limits=RATE if n % 2 else PAUSED) for n in range(5000)]
    rules += [tenant(f"t{n % 100}.k{n}.x", "a", RATE) for n in range(4900)]
    book = RuleBook(rules)
    started = time.process_time()
    held = book.holding(NOW)
    metered = book.metered(NOW)
    tags = json.loads(book.governing_tags(metered, NOW))
    took_s = time.process_time() - started
    assert len(metered) == 100 + 2500 + 4900
    assert held.held_count() == 10_000
    assert sum(len(by_key) for by_key in tags.values()) == 10_000
    assert took_s < 5.0, took_s
