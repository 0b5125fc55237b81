"""DISPATCHER_EVENT_USERS: which broker users may report on which jobs (format and checks); the
events consumer's settings; logged text cut short."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from consumers_sdk import contract
from dispatcher.amqp import event_users, events
from dispatcher.amqp.event_users import Grant
from dispatcher.settings import Settings


def test_each_entry_grants_prefixes_a_namespace_both_or_everything() -> None:
    grants = event_users.parse(
        "billing-consumer=billing.,payments-consumer=payments.|refunds.,"
        " ops=*, acme-consumer=acme:, acme-consumer=acme:acme.jobs.|acme.mail."
    )
    assert grants == (
        Grant(user="billing-consumer", prefix="billing"),
        Grant(user="payments-consumer", prefix="payments"),
        Grant(user="payments-consumer", prefix="refunds"),
        Grant(user="ops"),
        Grant(user="acme-consumer", namespace="acme"),
        Grant(user="acme-consumer", namespace="acme", prefix="acme.jobs"),
        Grant(user="acme-consumer", namespace="acme", prefix="acme.mail"),
    )
    assert event_users.columns(grants[:2]) == (
        ["billing-consumer", "payments-consumer"],
        [None, None],
        ["billing", "payments"],
    )


def test_unset_grants_nothing_and_restricts_nobody() -> None:
    assert event_users.parse("") == ()
    assert event_users.parse("  ") == ()
    assert event_users.columns(()) == ([], [], [])


def test_a_prefix_holding_a_colon_takes_the_leading_colon_of_any_namespace() -> None:
    assert event_users.parse("u=:a:b.") == (Grant(user="u", prefix="a:b"),)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("billing-consumer", "entry 1: expected user=grant"),
        ("=billing.", "entry 1: expected user=grant"),
        ("a=x.,b c=y.", "entry 2: expected user=grant"),
        ("a=x.,", "entry 2: expected user=grant"),
        ("a=", "entry 1: a grant names a namespace, prefixes or '*'"),
        ("a=|", "entry 1: a grant names a namespace, prefixes or '*'"),
        ("a=bad ns:x.", "entry 1: a namespace is 1-64 letters"),
        ("a=billing.a:b", "entry 1: a namespace is 1-64 letters"),
        ("a=x y", "entry 1: a routing-key prefix is 1-255"),
    ],
)
def test_a_bad_entry_is_named_by_position(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="^" + says.replace("*", r"\*").replace("|", r"\|")):
        event_users.parse(text)


def test_the_setting_is_checked_at_start_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_EVENT_USERS", "billing-consumer=billing.")
    assert Settings().event_grants() == (Grant(user="billing-consumer", prefix="billing"),)
    monkeypatch.setenv("DISPATCHER_EVENT_USERS", "billing-consumer")
    with pytest.raises(ValidationError, match="event_users"):
        Settings()


def test_the_events_bounds_are_settings_with_floors(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert settings.events_prefetch * settings.events_max_message_bytes == 16 * 1024 * 1024
    below = str(contract.EVENTS_MESSAGE_BYTES - 1)
    monkeypatch.setenv("DISPATCHER_EVENTS_MAX_MESSAGE_BYTES", below)
    with pytest.raises(ValidationError, match="events_max_message_bytes"):
        Settings()  # below what the SDK sends: every full message would be dropped


def test_logged_text_is_cut_saying_how_much_was_left_out() -> None:
    assert events.cut("short") == "short"
    long = "x" * 5_000_000
    logged = events.cut(long)
    assert len(logged) < events.LOGGED_CHARS + 40
    assert logged.endswith("... (4999800 more characters)")
