"""The unsent budget, pure: what fits, which stalled holders are closed to make room, progress."""

from __future__ import annotations

from dispatcher.api.unsent import Unsent

KIB = 1024


def budget(bytes_: int = 100 * KIB) -> Unsent:
    return Unsent(bytes_, free_bytes=10 * KIB, stalled_s=1.0)


def test_answers_within_the_budget_fit_and_are_counted() -> None:
    unsent = budget()
    assert unsent.admit("a", 60 * KIB, now=0.0) == []
    assert unsent.admit("b", 40 * KIB, now=0.0) == []
    assert unsent.total_bytes == 100 * KIB
    assert unsent.holds("a") == 60 * KIB


def test_past_the_budget_with_no_stalled_holder_nothing_changes() -> None:
    unsent = budget()
    unsent.admit("a", 60 * KIB, now=0.0)
    unsent.admit("b", 30 * KIB, now=0.5)
    assert unsent.admit("c", 20 * KIB, now=0.9) is None  # neither took nothing for a second
    assert unsent.total_bytes == 90 * KIB
    assert unsent.holds("c") == 0


def test_a_short_answer_on_a_holder_holding_nothing_always_fits() -> None:
    unsent = budget()
    unsent.admit("a", 100 * KIB, now=0.0)
    assert unsent.admit("b", 10 * KIB, now=0.1) == []
    assert unsent.total_bytes == 110 * KIB
    assert unsent.admit("b", 1, now=0.1) is None  # b holds something now


def test_stalled_holders_are_closed_longest_stalled_first_and_only_as_many_as_needed() -> None:
    unsent = budget()
    unsent.admit("old", 30 * KIB, now=0.0)
    unsent.admit("older", 30 * KIB, now=-1.0)
    unsent.admit("fresh", 30 * KIB, now=4.5)
    assert unsent.admit("new", 35 * KIB, now=5.0) == ["older"]
    assert unsent.holds("older") == 0
    assert unsent.total_bytes == 95 * KIB
    assert unsent.admit("new2", 60 * KIB, now=5.0) is None  # only "old" is stalled: not enough
    assert unsent.holds("old") == 30 * KIB


def test_an_answer_larger_than_the_budget_goes_out_only_alone() -> None:
    unsent = budget()
    unsent.admit("a", 20 * KIB, now=0.0)
    assert unsent.admit("big", 500 * KIB, now=0.5) is None
    assert unsent.admit("big", 500 * KIB, now=1.5) == ["a"]  # a stalled: closed, big alone
    assert unsent.total_bytes == 500 * KIB
    assert unsent.admit("big", 500 * KIB, now=1.5) == []  # alone, it may add more


def test_a_smaller_size_is_progress_and_zero_releases() -> None:
    unsent = budget()
    unsent.admit("a", 50 * KIB, now=0.0)
    unsent.update("a", 50 * KIB, now=3.0)
    assert unsent.progressed_at("a") == 0.0
    unsent.update("a", 60 * KIB, now=4.0)  # uvicorn's own bytes (headers): not progress
    assert unsent.progressed_at("a") == 0.0
    assert unsent.total_bytes == 60 * KIB
    unsent.update("a", 20 * KIB, now=5.0)
    assert unsent.progressed_at("a") == 5.0
    assert unsent.total_bytes == 20 * KIB
    unsent.update("a", 0, now=6.0)
    assert unsent.progressed_at("a") is None
    assert unsent.total_bytes == 0


def test_a_holder_first_measured_starts_its_progress_clock_then() -> None:
    unsent = budget()
    unsent.update("a", 5 * KIB, now=2.0)
    assert unsent.progressed_at("a") == 2.0
    assert unsent.total_bytes == 5 * KIB
    unsent.release("a")
    unsent.release("a")
    assert unsent.total_bytes == 0


def test_progress_seen_elsewhere_restarts_the_clock_of_a_holder_only() -> None:
    unsent = budget()
    unsent.admit("a", 50 * KIB, now=0.0)
    unsent.progressed("a", now=3.0)
    unsent.progressed("b", now=3.0)  # holds nothing: nothing to note
    assert unsent.progressed_at("a") == 3.0
    assert unsent.progressed_at("b") is None
    assert unsent.total_bytes == 50 * KIB


def test_nothing_always_fits() -> None:
    unsent = budget()
    unsent.admit("a", 100 * KIB, now=0.0)
    unsent.admit("b", 10 * KIB, now=0.0)
    assert unsent.admit("b", 0, now=0.5) == []  # the empty end of a streamed answer
