"""A change merged into a stored schedule: what it keeps, what it clears, where the schedule goes
on, and what it refuses (naming the field)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher import errors
from dispatcher.recurring import changes, model
from dispatcher.recurring.occurrences import Missed, Timing

START = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
KEPT_NEXT_AT = datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
TEMPLATE = model.Template(routing_key="a.b", payload=b"{}", headers={})


def stored(timing: Timing, *, paused: bool = False) -> model.Schedule:
    spec = model.ScheduleSpec(name="s", timing=timing, template=TEMPLATE, paused=paused)
    return model.Schedule(
        id=1,
        namespace=None,
        spec=spec,
        next_at=KEPT_NEXT_AT,
        last_fired_at=None,
        created_at=START,
        updated_at=START,
    )


def merge(
    current: model.Schedule, min_interval_s: int = 60, **asked: object
) -> tuple[model.ScheduleSpec, datetime | None]:
    change = changes.ScheduleChange(given=frozenset(asked), **asked)  # type: ignore[arg-type]
    return changes.merged(current, change, now=NOW, min_interval_s=min_interval_s)


EVERY_HOUR = Timing(cron="0 * * * *", start_at=START, end_at=START + timedelta(days=365))
EVERY_10S = Timing(interval_s=10, start_at=START)


def test_an_interval_given_replaces_the_cron_and_restarts_from_now() -> None:
    spec, next_at = merge(stored(EVERY_HOUR), interval_s=120)
    assert spec.timing.cron is None
    assert spec.timing.interval_s == 120
    assert spec.timing.end_at == EVERY_HOUR.end_at  # not named: kept
    assert next_at == datetime(2026, 3, 1, 12, 2, tzinfo=UTC)  # the first at or after now


def test_a_cron_given_replaces_the_interval() -> None:
    spec, next_at = merge(stored(EVERY_10S), cron="*/5 * * * *", timezone="Europe/Paris")
    assert spec.timing.interval_s is None
    assert spec.timing.cron == "*/5 * * * *"
    assert spec.timing.timezone == "Europe/Paris"
    assert next_at == datetime(2026, 3, 1, 12, 5, tzinfo=UTC)


def test_an_end_given_as_none_removes_the_end() -> None:
    spec, _ = merge(stored(EVERY_HOUR), end_at=None)
    assert spec.timing.end_at is None


def test_changes_that_keep_the_timing_keep_next_at() -> None:
    other = model.Template(routing_key="c.d", payload=b"[]", headers={})
    spec, next_at = merge(stored(EVERY_HOUR), template=other, missed=Missed.ALL, grace_s=5.0)
    assert next_at == KEPT_NEXT_AT
    assert (spec.template, spec.missed, spec.grace_s) == (other, Missed.ALL, 5.0)
    assert spec.timing == EVERY_HOUR


def test_a_resume_restarts_from_now_and_a_pause_keeps_next_at() -> None:
    resumed, next_at = merge(stored(EVERY_10S, paused=True), paused=False)
    assert not resumed.paused
    assert next_at == NOW  # an occurrence itself: at or after now
    paused, next_at = merge(stored(EVERY_10S), paused=True)
    assert paused.paused
    assert next_at == KEPT_NEXT_AT


def test_only_an_interval_given_now_must_respect_the_floor() -> None:
    spec, _ = merge(stored(EVERY_10S), paused=True)  # stored before the floor was raised to 60
    assert spec.timing.interval_s == 10
    with pytest.raises(errors.InvalidField) as refused:
        merge(stored(EVERY_HOUR), interval_s=30)
    assert refused.value.field == "interval_s"


def test_cron_and_interval_together_are_refused() -> None:
    with pytest.raises(errors.InvalidField) as refused:
        merge(stored(EVERY_HOUR), cron="* * * * *", interval_s=60)
    assert refused.value.field == "interval_s"


def test_an_end_before_the_start_is_refused() -> None:
    with pytest.raises(errors.InvalidField) as refused:
        merge(stored(EVERY_HOUR), end_at=START - timedelta(seconds=1))
    assert refused.value.field == "end_at"


def test_a_zone_gone_from_the_tz_database_is_refused_by_name() -> None:
    gone = Timing(cron="0 * * * *", timezone="Mars/Olympus", start_at=START)
    with pytest.raises(errors.InvalidField) as refused:
        merge(stored(gone), cron="5 * * * *")
    assert refused.value.field == "timezone"
