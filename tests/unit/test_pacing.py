"""The catch-up lane's pace: a token bucket with the clock passed in."""

import pytest

from dispatcher.firing.pacing import Pace


def test_unlimited_pace_grants_everything() -> None:
    pace = Pace(0, batch=500)
    assert pace.take(0.0, 10_000) == 10_000
    assert pace.wait_s(0.0, 10_000) == 0.0


def test_a_pace_grants_its_rate_over_time_and_no_more() -> None:
    pace = Pace(1000, batch=500)
    granted = pace.take(0.0, 5000)
    assert granted == 500  # a full bucket at most: one batch
    assert pace.take(0.0, 5000) == 0
    assert pace.wait_s(0.0, 5000) == pytest.approx(0.05)  # one chunk, rate/20
    total = granted
    for step in range(1, 101):  # ten seconds in 0.1 s steps
        total += pace.take(step * 0.1, 5000)
    assert total == pytest.approx(500 + 10 * 1000, abs=2)


def test_a_slow_pace_still_hands_out_whole_jobs() -> None:
    pace = Pace(2, batch=500)
    assert pace.take(0.0, 10) == 2
    assert pace.wait_s(0.0, 10) == pytest.approx(0.5)
    assert pace.take(0.5, 10) == 1
