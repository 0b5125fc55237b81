"""ReadGate on a stepped clock: a slot at a time, each resting in proportion to its read and at
least the spacing the rate asks, the refused told when to ask again."""

from __future__ import annotations

import math

import pytest

from dispatcher.bulk.read_gate import ReadGate, Refused


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gate(clock: Clock, *, slots: int = 1, duty: float = 0.25, rate: float = 10.0) -> ReadGate:
    return ReadGate(slots=slots, duty=duty, rate_per_s=rate, mono=clock)


def test_a_read_in_flight_takes_the_only_slot_and_the_next_is_refused() -> None:
    clock = Clock()
    reads = gate(clock)
    assert reads.enter() == 0
    assert reads.enter() == Refused(math.inf)


def test_a_slot_rests_three_times_its_read_at_a_quarter_duty() -> None:
    clock = Clock()
    reads = gate(clock)
    slot = reads.enter()
    assert isinstance(slot, int)
    clock.now += 2.0
    reads.leave(slot, took_s=2.0)
    clock.now += 5.9
    refused = reads.enter()
    assert isinstance(refused, Refused)
    assert refused.wait_s == pytest.approx(0.1)
    assert refused.retry_after_s == 1
    clock.now += 0.2
    assert reads.enter() == 0


def test_a_long_rest_is_told_in_whole_seconds() -> None:
    clock = Clock()
    reads = gate(clock)
    reads.leave(reads.enter(), took_s=4.0)  # type: ignore[arg-type]
    refused = reads.enter()
    assert isinstance(refused, Refused)
    assert (refused.wait_s, refused.retry_after_s) == (12.0, 12)


def test_quick_reads_start_at_most_the_rate_a_second_after_a_burst() -> None:
    clock = Clock()
    reads = gate(clock, slots=2, rate=4.0)
    started = 0
    for _ in range(100):  # ten seconds in steps of 0.1 s, each read taking 1 ms
        for _ in range(3):
            slot = reads.enter()
            if isinstance(slot, int):
                started += 1
                clock.now += 0.001
                reads.leave(slot, took_s=0.001)
        clock.now += 0.1
    assert 4 + 38 <= started <= 4 + 42  # the burst, then four a second


def test_a_dry_run_and_the_action_after_it_pass_at_once() -> None:
    clock = Clock()
    reads = gate(clock)
    for _ in range(2):
        slot = reads.enter()
        assert isinstance(slot, int)
        clock.now += 0.004
        reads.leave(slot, took_s=0.004)
        clock.now += 0.1


def test_past_the_burst_the_refused_is_told_when_a_read_may_start() -> None:
    clock = Clock()
    reads = gate(clock, duty=1.0, rate=0.5)  # one read every two seconds, a burst of one
    reads.leave(reads.enter(), took_s=0.0)  # type: ignore[arg-type]
    refused = reads.enter()
    assert isinstance(refused, Refused)
    assert (refused.wait_s, refused.retry_after_s) == (2.0, 2)


def test_several_slots_read_at_once() -> None:
    clock = Clock()
    reads = gate(clock, slots=3)
    assert [reads.enter() for _ in range(4)] == [0, 1, 2, Refused(math.inf)]


@pytest.mark.parametrize(
    ("slots", "duty", "rate"), [(0, 0.5, 1.0), (1, 0.0, 1.0), (1, 1.5, 1.0), (1, 0.5, 0.0)]
)
def test_a_gate_that_could_never_open_is_refused(slots: int, duty: float, rate: float) -> None:
    with pytest.raises(ValueError, match="read gate"):
        ReadGate(slots=slots, duty=duty, rate_per_s=rate, mono=Clock())
