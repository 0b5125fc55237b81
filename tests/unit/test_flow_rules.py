"""Which flow rule governs a job, what the SQL is told is held, and what a rule may be."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.flow.rules import Limits, Rule, RuleBook, RuleRefused, check, check_key

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PAUSED = Limits(paused=True)


def rule(key: str, namespace: str | None = None, limits: Limits = PAUSED) -> Rule:
    return Rule(key=key, namespace=namespace, limits=limits, updated_at=NOW)


def test_the_longest_key_matching_word_by_word_governs() -> None:
    book = RuleBook([rule("billing"), rule("billing.invoice"), rule("bill")])
    assert book.governing("billing.invoice.send", None) == rule("billing.invoice")
    assert book.governing("billing.refund", None) == rule("billing")
    assert book.governing("billing", None) == rule("billing")
    assert book.governing("billingx.invoice", None) is None  # words, not characters
    assert book.governing("bill.x", None) == rule("bill")
    assert book.governing("other", None) is None


def test_a_rule_naming_the_jobs_namespace_governs_before_one_for_every_namespace() -> None:
    every, own = rule("billing"), rule("billing", "shop")
    book = RuleBook([every, own])
    assert book.governing("billing.x", "shop") == own
    assert book.governing("billing.x", "other") == every
    assert book.governing("billing.x", None) == every
    # The default namespace is named "" by a rule, None or "" by a job.
    default = rule("billing", "")
    assert RuleBook([default]).governing("billing", None) == default
    assert RuleBook([default]).governing("billing", "shop") is None
    # A longer key wins even for every namespace.
    longer = rule("billing.x")
    assert RuleBook([own, longer]).governing("billing.x", "shop") == longer


def test_a_pause_holds_until_its_end_and_the_sql_is_told_so() -> None:
    until = NOW + timedelta(minutes=5)
    book = RuleBook([rule("a", limits=Limits(paused=True, paused_until=until)), rule("b")])
    assert book.holds("a.x", None, NOW) is not None
    assert book.holds("a.x", None, until) is None
    held = book.holding(NOW)
    assert held.weighed == {"a": {"*": True}, "b": {"*": True}}
    assert book.next_change(NOW) == until
    assert book.holding(until).weighed == {"b": {"*": True}}
    assert book.next_change(until) is None
    assert book.counts(NOW) == {"paused": 2}


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
    assert held.weighed == {"billing": {"*": True}, "billing.urgent": {"*": False}}
    assert held.first_words == ["billing"]
    assert held.rules_json == '{"billing":{"*":true},"billing.urgent":{"*":false}}'
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
