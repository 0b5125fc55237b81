"""The five-field cron parser and its next matching wall-clock minute."""

from __future__ import annotations

from datetime import datetime

import pytest

from dispatcher.schedules import cron


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
