"""The five-field cron parser and its next matching wall-clock minute."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.recurring import cron


def following(expression: str, start: datetime, count: int) -> list[datetime]:
    parsed = cron.parse(expression)
    found = []
    current = start
    for _ in range(count):
        nxt = parsed.next_after(current)
        assert nxt is not None
        found.append(nxt)
        current = nxt
    return found


def test_every_minute_is_strictly_after_and_whole_minutes() -> None:
    assert following("* * * * *", datetime(2026, 1, 1, 10, 0, 30), 2) == [
        datetime(2026, 1, 1, 10, 1),
        datetime(2026, 1, 1, 10, 2),
    ]


def test_steps_ranges_and_lists() -> None:
    parsed = cron.parse("*/15 9-17/4 * * *")
    assert parsed.minutes == {0, 15, 30, 45}
    assert parsed.hours == {9, 13, 17}
    assert cron.parse("5,10-12,50/5 * * * *").minutes == {5, 10, 11, 12, 50, 55}


def test_month_and_day_names_and_sunday_as_seven() -> None:
    parsed = cron.parse("0 8 * JAN,mar-may Mon-Fri")
    assert parsed.months == {1, 3, 4, 5}
    assert parsed.weekdays == {1, 2, 3, 4, 5}
    assert cron.parse("0 0 * * 7").weekdays == {0}
    assert cron.parse("0 0 * * sun").weekdays == {0}


def test_weekdays_only() -> None:
    # 2026-11-27 is a Friday: the next weekday 08:00 after Friday noon is Monday.
    assert following("0 8 * * mon-fri", datetime(2026, 11, 27, 12, 0), 1) == [
        datetime(2026, 11, 30, 8, 0)
    ]


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    # The 13th, or any Friday (Vixie cron's OR rule). 2026-11-01 is a Sunday.
    assert following("0 0 13 * fri", datetime(2026, 11, 1), 3) == [
        datetime(2026, 11, 6),
        datetime(2026, 11, 13),
        datetime(2026, 11, 20),
    ]


def test_a_starred_day_field_makes_the_other_one_decide() -> None:
    # Day-of-week '*/1' starts with '*': only the 13th counts.
    assert following("0 0 13 * */1", datetime(2026, 11, 1), 2) == [
        datetime(2026, 11, 13),
        datetime(2026, 12, 13),
    ]


def test_leap_day_and_year_end() -> None:
    assert following("0 0 29 2 *", datetime(2026, 1, 1), 1) == [datetime(2028, 2, 29)]
    assert following("59 23 31 12 *", datetime(2026, 12, 31, 23, 59), 1) == [
        datetime(2027, 12, 31, 23, 59)
    ]


def test_macros() -> None:
    assert cron.parse("@hourly") == cron.parse("0 * * * *")
    assert cron.parse("@daily") == cron.parse("0 0 * * *")
    assert following("@monthly", datetime(2026, 11, 23), 1) == [datetime(2026, 12, 1)]


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("* * * *", "5 fields"),
        ("* * * * * *", "5 fields"),
        ("60 * * * *", "minute '60': 60 is outside 0-59"),
        ("* 24 * * *", "hour"),
        ("* * 0 * *", "day of month"),
        ("* * * 13 *", "month"),
        ("* * * * 8", "day of week"),
        ("*/0 * * * *", "step"),
        ("5-1 * * * *", "backwards"),
        ("x * * * *", "not a number"),
        ("* * * foo *", "month"),
        ("1,,2 * * * *", "minute"),
        ("0 0 30 2 *", "matches no date"),
        ("0 0 31 4,6 *", "matches no date"),
        ("\u00b2 * * * *", "not a number"),
    ],
)
def test_invalid_expressions_say_which_field(expression: str, names: str) -> None:
    with pytest.raises(cron.CronError, match=names):
        cron.parse(expression)


# --- the search against a brute-force scan ------------------------------------------------------


def _field(draw: st.DrawFn, low: int, high: int) -> str:
    kind = draw(st.sampled_from(["*", "value", "range", "step", "list"]))
    a = draw(st.integers(low, high))
    b = draw(st.integers(a, high))
    if kind == "*":
        return "*"
    if kind == "value":
        return str(a)
    if kind == "range":
        return f"{a}-{b}"
    if kind == "step":
        return f"{draw(st.sampled_from(['*', f'{a}-{b}', str(a)]))}/{draw(st.integers(1, 9))}"
    return ",".join(str(v) for v in draw(st.lists(st.integers(low, high), min_size=1, max_size=4)))


@st.composite
def expressions(draw: st.DrawFn) -> str:
    # Minutes and hours kept dense enough that a brute-force scan of a few weeks finds matches.
    return " ".join(
        [
            _field(draw, 0, 59),
            draw(st.sampled_from(["*", "*/3", "0-11", "5,17"])),
            _field(draw, 1, 31),
            draw(st.sampled_from(["*", "1-6", "*/2", "feb,mar,nov"])),
            _field(draw, 0, 7),
        ]
    )


def _brute_force(parsed: cron.Cron, start: datetime, minutes: int) -> datetime | None:
    moment = start.replace(second=0, microsecond=0)
    for _ in range(minutes):
        moment += timedelta(minutes=1)
        if (
            moment.month in parsed.months
            and parsed.day_matches(moment.year, moment.month, moment.day)
            and moment.hour in parsed.hours
            and moment.minute in parsed.minutes
        ):
            return moment
    return None


@settings(max_examples=60, deadline=None)
@given(
    expression=expressions(),
    start=st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31)),
)
def test_next_after_is_the_first_match_a_minute_scan_finds(
    expression: str, start: datetime
) -> None:
    try:
        parsed = cron.parse(expression)
    except cron.CronError:
        return  # e.g. 31 in months without one: refused, checked above
    scanned = _brute_force(parsed, start, 60 * 24 * 62)
    found = parsed.next_after(start)
    if scanned is not None:
        assert found == scanned
    else:
        assert found is None or found - start > timedelta(days=61)
