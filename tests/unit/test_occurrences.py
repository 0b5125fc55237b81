"""Occurrences of schedules as UTC instants (zones, DST, intervals) and the missed policies."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.recurring import cron
from dispatcher.recurring.occurrences import Missed, Timing, idempotency_key, plan


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def cron_timing(expression: str, zone: str = "UTC", **kwargs: datetime) -> Timing:
    return Timing(cron=expression, timezone=zone, start_at=utc(2020, 1, 1), **kwargs)


def test_daily_in_asia_shanghai_is_eight_hours_ahead_of_utc() -> None:
    timing = cron_timing("0 9 * * *", "Asia/Shanghai")
    assert timing.upcoming(utc(2026, 11, 23, 2, 0), 2) == [
        utc(2026, 11, 24, 1, 0),  # 09:00 +08:00
        utc(2026, 11, 25, 1, 0),
    ]
    assert timing.after(utc(2026, 11, 23, 0, 59)) == utc(2026, 11, 23, 1, 0)


def test_spring_forward_gap_fires_once_at_the_first_valid_instant() -> None:
    # New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC). 02:30 does not exist.
    timing = cron_timing("30 2 * * *", "America/New_York")
    assert timing.upcoming(utc(2026, 3, 7, 12, 0), 3) == [
        utc(2026, 3, 8, 7, 0),  # 03:00 EDT, the first instant after the gap
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
        utc(2026, 3, 10, 6, 30),
    ]


def test_every_minute_through_the_gap_fires_the_gap_end_once() -> None:
    timing = cron_timing("* * * * *", "America/New_York")
    found = timing.upcoming(utc(2026, 3, 8, 6, 58), 4)
    # 01:58, 01:59 EST, then 02:00-02:59 (absent) and 03:00 EDT all map to 07:00 UTC: once.
    assert found == [
        utc(2026, 3, 8, 6, 58),
        utc(2026, 3, 8, 6, 59),
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 8, 7, 1),
    ]


def test_fall_back_repeated_time_fires_once_at_its_first_occurrence() -> None:
    # New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens at 05:30 and 06:30 UTC.
    timing = cron_timing("30 1 * * *", "America/New_York")
    assert timing.upcoming(utc(2026, 10, 31, 12, 0), 2) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT (fold=0)
        utc(2026, 11, 2, 6, 30),  # 01:30 EST the next day
    ]
    # Asked from inside the repeated hour (01:10 EST), the repeat is not fired again.
    assert timing.after(utc(2026, 11, 1, 6, 10)) == utc(2026, 11, 2, 6, 30)


def test_hourly_across_berlin_transitions() -> None:
    timing = cron_timing("0 * * * *", "Europe/Berlin")
    # 2026-03-29: 02:00 CET -> 03:00 CEST at 01:00 UTC; the hour 02:00 does not exist.
    assert timing.upcoming(utc(2026, 3, 28, 23, 30), 3) == [
        utc(2026, 3, 29, 0, 0),  # 01:00 CET
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST (02:00 mapped to it, fired once)
        utc(2026, 3, 29, 2, 0),  # 04:00 CEST
    ]
    # 2026-10-25: 03:00 CEST -> 02:00 CET at 01:00 UTC; 02:00 happens twice, fired at the first.
    assert timing.upcoming(utc(2026, 10, 24, 23, 30), 3) == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 2, 0),  # 03:00 CET: the second 02:00 (01:00 UTC) is skipped
        utc(2026, 10, 25, 3, 0),
    ]


def test_interval_counts_from_start_and_ends_inclusive() -> None:
    timing = Timing(interval_s=10, start_at=utc(2026, 1, 1), end_at=utc(2026, 1, 1, 0, 0, 30))
    assert timing.first() == utc(2026, 1, 1)
    assert timing.after(utc(2026, 1, 1, 0, 0, 5)) == utc(2026, 1, 1, 0, 0, 10)
    assert timing.after(utc(2026, 1, 1, 0, 0, 10)) == utc(2026, 1, 1, 0, 0, 20)
    assert timing.upcoming(utc(2025, 1, 1), 10) == [
        utc(2026, 1, 1, 0, 0, s) for s in (0, 10, 20, 30)
    ]
    assert timing.after(utc(2026, 1, 1, 0, 0, 30)) is None


def test_cron_start_is_inclusive() -> None:
    timing = Timing(cron="0 * * * *", start_at=utc(2026, 1, 1, 5))
    assert timing.first() == utc(2026, 1, 1, 5)


def test_both_or_neither_of_cron_and_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        Timing(cron="* * * * *", interval_s=1, start_at=utc(2026, 1, 1))
    with pytest.raises(ValueError, match="not both"):
        Timing(start_at=utc(2026, 1, 1))


def test_idempotency_key_names_the_occurrence_in_utc() -> None:
    moment = datetime(2026, 1, 1, 17, tzinfo=timezone(timedelta(hours=8)))
    assert idempotency_key("nightly", moment) == "schedule:nightly:2026-01-01T09:00:00Z"
    assert (
        idempotency_key("x", utc(2026, 1, 1) + timedelta(microseconds=1500))
        == "schedule:x:2026-01-01T00:00:00.001500Z"
    )


# --- a materialiser pass ------------------------------------------------------------------------

EVERY_10S = Timing(interval_s=10, start_at=utc(2026, 1, 1))
NOW = utc(2026, 1, 1, 1, 0, 0)


DAY_S = 86400.0


def run_plan(
    missed: Missed,
    next_at: datetime,
    *,
    limit: int = 1000,
    grace_s: float = 30,
    catchup_s: float = DAY_S,
):
    return plan(
        EVERY_10S,
        next_at,
        now=NOW,
        ahead_s=15,
        grace_s=grace_s,
        missed=missed,
        limit=limit,
        catchup_s=catchup_s,
    )


def test_on_time_pass_fires_up_to_the_horizon_and_continues_after_it() -> None:
    result = run_plan(Missed.SKIP, NOW)
    assert result.fire == [NOW, NOW + timedelta(seconds=10)]
    assert result.next_at == NOW + timedelta(seconds=20)
    assert not result.skipped_missed


def test_late_by_less_than_the_grace_is_not_missed() -> None:
    result = run_plan(Missed.SKIP, NOW - timedelta(seconds=20))
    assert result.fire[0] == NOW - timedelta(seconds=20)
    assert not result.skipped_missed


def test_missed_all_fires_every_missed_occurrence_bounded_per_pass() -> None:
    start = NOW - timedelta(minutes=10)  # 60 occurrences missed
    first = run_plan(Missed.ALL, start, limit=25)
    assert first.fire == [start + timedelta(seconds=10 * i) for i in range(25)]
    assert first.next_at == start + timedelta(seconds=250)
    rest = run_plan(Missed.ALL, first.next_at)
    assert rest.fire[0] == first.next_at
    assert rest.fire[-1] == NOW + timedelta(seconds=10)
    assert len(first.fire) + len(rest.fire) == 60 + 2


def test_missed_latest_fires_only_the_most_recent_missed_one() -> None:
    result = run_plan(Missed.LATEST, NOW - timedelta(days=30))
    # Missed means earlier than now - 30 s: the latest of those is now - 40 s.
    assert result.fire == [
        NOW - timedelta(seconds=40),
        NOW - timedelta(seconds=30),
        NOW - timedelta(seconds=20),
        NOW - timedelta(seconds=10),
        NOW,
        NOW + timedelta(seconds=10),
    ]
    assert result.skipped_missed


def test_missed_skip_fires_none_of_them() -> None:
    result = run_plan(Missed.SKIP, NOW - timedelta(days=30))
    assert result.fire[0] == NOW - timedelta(seconds=30)  # within the grace: not missed
    assert result.skipped_missed
    assert result.next_at == NOW + timedelta(seconds=20)


def test_missed_latest_on_a_sparse_cron() -> None:
    timing = cron_timing("0 3 1 * *")  # monthly
    result = plan(
        timing,
        utc(2025, 1, 1, 3),
        now=NOW,
        ahead_s=60,
        grace_s=60,
        missed=Missed.LATEST,
        limit=100,
        catchup_s=DAY_S,
    )
    assert result.fire == [utc(2025, 12, 1, 3)]
    assert result.next_at == utc(2026, 1, 1, 3)  # two hours ahead: a later pass


def test_missed_all_makes_up_only_the_catchup_window() -> None:
    # Started in year 1 (or down for years): the 10 minutes before now are made up, no more.
    early = Timing(interval_s=10, start_at=datetime(1, 1, 2, tzinfo=UTC))
    result = plan(
        early,
        early.start_at,
        now=NOW,
        ahead_s=15,
        grace_s=30,
        missed=Missed.ALL,
        limit=1000,
        catchup_s=600,
    )
    assert result.fire[0] == NOW - timedelta(seconds=600)
    assert result.fire[-1] == NOW + timedelta(seconds=10)
    assert len(result.fire) == 62
    assert result.skipped_missed


def test_a_grace_longer_than_the_catchup_window_is_cut_to_it() -> None:
    result = run_plan(Missed.SKIP, NOW - timedelta(days=30), grace_s=7 * DAY_S, catchup_s=60)
    assert result.fire[0] == NOW - timedelta(seconds=60)
    latest = run_plan(Missed.LATEST, NOW - timedelta(days=30), grace_s=7 * DAY_S, catchup_s=60)
    assert latest.fire[:2] == [NOW - timedelta(seconds=70), NOW - timedelta(seconds=60)]


def test_a_schedule_past_its_end_fires_nothing_and_ends() -> None:
    timing = Timing(interval_s=10, start_at=utc(2026, 1, 1), end_at=NOW - timedelta(seconds=5))
    result = plan(
        timing,
        NOW - timedelta(seconds=10),
        now=NOW,
        ahead_s=15,
        grace_s=30,
        missed=Missed.ALL,
        limit=10,
        catchup_s=DAY_S,
    )
    assert result.fire == [NOW - timedelta(seconds=10)]
    assert result.next_at is None


def test_no_occurrence_past_the_last_representable_time() -> None:
    late = datetime(9999, 12, 31, 23, 59, 30, tzinfo=UTC)
    assert Timing(cron="* * * * *", start_at=late).first() is None
    assert Timing(interval_s=60, start_at=late).after(late) is None
    assert Timing(interval_s=60, start_at=datetime.min.replace(tzinfo=UTC)).first() is not None
    # A cron whose next month lies past 9999 (January only, from late December 9999).
    december = datetime(9999, 12, 30, tzinfo=UTC)
    assert Timing(cron="0 0 * 1 *", start_at=december).first() is None
    assert cron.parse("0 0 * 1 *").next_after(datetime(9999, 12, 30)) is None


ZONES = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Shanghai"]


@settings(max_examples=60, deadline=None)
@given(
    expression=st.sampled_from(
        ["* * * * *", "*/7 * * * *", "30 2 * * *", "0,30 1-3 * * *", "15 * * * 0", "0 0 * * *"]
    ),
    zone_name=st.sampled_from(ZONES),
    # Around the 2026 transitions of the zones above (March/April and October/November).
    start=st.sampled_from(
        [
            utc(2026, 3, 7),
            utc(2026, 3, 28),
            utc(2026, 4, 4),
            utc(2026, 10, 3),
            utc(2026, 10, 24),
            utc(2026, 10, 31),
        ]
    ),
    offset_min=st.integers(0, 3 * 24 * 60),
)
def test_occurrences_increase_and_each_is_a_match_or_a_gap_end_never_a_repeat(
    expression: str, zone_name: str, start: datetime, offset_min: int
) -> None:
    zone = ZoneInfo(zone_name)
    parsed = cron.parse(expression)
    timing = Timing(cron=expression, timezone=zone_name, start_at=utc(2020, 1, 1))
    found = timing.upcoming(start + timedelta(minutes=offset_min), 30)
    assert all(a < b for a, b in itertools.pairwise(found))
    for instant in found:
        local = instant.astimezone(zone)
        wall = local.replace(tzinfo=None)
        matches = (
            wall.month in parsed.months
            and parsed.day_matches(wall.year, wall.month, wall.day)
            and wall.hour in parsed.hours
            and wall.minute in parsed.minutes
        )
        offset_now = local.utcoffset()
        offset_before = (instant - timedelta(minutes=1)).astimezone(zone).utcoffset()
        assert offset_now is not None
        assert offset_before is not None
        just_after_gap = offset_now > offset_before  # the clock jumped forward here
        assert matches or just_after_gap, (expression, zone_name, instant, wall)
        # Never the second pass through a repeated hour: the first pass (fold=0) is this instant.
        assert wall.replace(tzinfo=zone, fold=0).astimezone(UTC) == instant
