"""The clock filter (dispatcher/timing/timesource.py): PostgreSQL's clock from round trips, as NTP
does."""

from __future__ import annotations

import pytest

from dispatcher.timing.timesource import DRIFT_PER_S, NEAR_BEST_S, WINDOW, ClockFilter, Sample

DB_AHEAD = 1_700_000_000.0  # PostgreSQL's clock minus the monotonic one, in these samples


def sample(at: float, rtt: float, *, db_ahead: float = DB_AHEAD, wall_ahead: float = 0.0) -> Sample:
    """A round trip centred on monotonic AT; PostgreSQL's clock DB_AHEAD past the monotonic one,
    the wall clock WALL_AHEAD past PostgreSQL's."""
    return Sample(
        sent=at - rtt / 2,
        received=at + rtt / 2,
        db=at + db_ahead,
        wall=at + db_ahead + wall_ahead,
    )


def test_no_sample_no_estimate() -> None:
    assert ClockFilter().estimate() is None


def test_the_offset_is_taken_at_the_midpoint_to_within_half_the_round_trip() -> None:
    clock = ClockFilter()
    clock.add(Sample(sent=10.0, received=10.004, db=DB_AHEAD + 10.002, wall=DB_AHEAD + 30.002))
    estimate = clock.estimate()
    assert estimate is not None
    assert estimate.offset == pytest.approx(DB_AHEAD)
    assert estimate.error == pytest.approx(0.002)
    assert estimate.wall_offset == pytest.approx(20.0)


def test_the_shortest_round_trip_of_the_window_is_believed() -> None:
    clock = ClockFilter()
    clock.add(sample(1.0, 0.010, db_ahead=DB_AHEAD + 0.004))  # queued: off by 4 ms of its 5
    clock.add(sample(2.0, 0.001))
    clock.add(sample(3.0, 0.008, db_ahead=DB_AHEAD - 0.003))
    estimate = clock.estimate()
    assert estimate is not None
    assert estimate.offset == pytest.approx(DB_AHEAD)
    assert estimate.error == pytest.approx(0.0005)
    assert estimate.at == pytest.approx(2.0)


def test_a_sample_leaves_the_window_after_window_more() -> None:
    clock = ClockFilter()
    clock.add(sample(1.0, 0.001))
    for n in range(WINDOW):
        clock.add(sample(2.0 + n, 0.004))
    estimate = clock.estimate()
    assert estimate is not None
    assert estimate.error == pytest.approx(0.002)


def test_the_error_grows_with_the_estimates_age() -> None:
    clock = ClockFilter()
    clock.add(sample(1.0, 0.002))
    estimate = clock.estimate()
    assert estimate is not None
    assert estimate.error_at(101.0) == pytest.approx(0.001 + 100 * DRIFT_PER_S)


def test_a_step_drops_the_older_samples_and_is_counted() -> None:
    clock = ClockFilter()
    clock.add(sample(1.0, 0.001))
    clock.add(sample(2.0, 0.003, db_ahead=DB_AHEAD - 60.0))  # PostgreSQL's clock a minute back
    estimate = clock.estimate()
    assert estimate is not None
    assert estimate.offset == pytest.approx(DB_AHEAD - 60.0)
    assert clock.steps == 1


def test_jitter_within_the_round_trips_is_no_step() -> None:
    clock = ClockFilter()
    clock.add(sample(1.0, 0.002))
    clock.add(sample(2.0, 0.010, db_ahead=DB_AHEAD + 0.006))
    assert clock.steps == 0


def test_the_wall_clock_is_read_from_the_latest_sample() -> None:
    clock = ClockFilter()
    clock.add(sample(1.0, 0.001))
    clock.add(sample(2.0, 0.004, wall_ahead=3600.0))  # the wall clock stepped an hour forward
    estimate = clock.estimate()
    assert estimate is not None
    assert estimate.offset == pytest.approx(DB_AHEAD)  # firing time unmoved
    assert estimate.wall_offset == pytest.approx(3600.0)


def test_samples_nearly_as_good_as_the_best_are_averaged() -> None:
    clock = ClockFilter()
    clock.add(sample(1.0, 0.0010, db_ahead=DB_AHEAD + 0.0001))
    clock.add(sample(2.0, 0.0010 + NEAR_BEST_S, db_ahead=DB_AHEAD - 0.0001))
    clock.add(sample(3.0, 0.0100, db_ahead=DB_AHEAD + 0.0040))  # queued: not believed
    estimate = clock.estimate()
    assert estimate is not None
    assert estimate.offset == pytest.approx(DB_AHEAD, abs=1e-6)
    assert estimate.error == pytest.approx(0.0005 + NEAR_BEST_S / 2)
    assert estimate.at == pytest.approx(1.0)  # the oldest believed: its error has aged most
