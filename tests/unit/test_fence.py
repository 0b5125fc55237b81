"""The clock fence's arithmetic: each claimed job goes at the sooner of the two clocks' times
while the node's time is believed, by the claim's reading of PostgreSQL's clock alone once that
time ran ahead or stepped, and never before the job before it."""

from __future__ import annotations

import pytest

from dispatcher.firing import fence

# PostgreSQL's clock read 1000.000 as the claim answered; the monotonic clock read 50.000 as the
# claim was sent and 50.004 as its answer was read.
ANSWERED = 1000.0


def readings(*, node_s: float = ANSWERED - 0.003, step_s: float = 0.0) -> fence.Readings:
    """A 4 ms claim; the node's time ``node_s`` as it was sent (by default 3 ms behind the
    reading, the half round trip), moved ``step_s`` more than the monotonic clock meanwhile."""
    return fence.Readings(
        sent_s=node_s,
        sent_mono=50.0,
        read_s=node_s + 0.004 + step_s,
        read_mono=50.004,
        answered_at_s=ANSWERED,
        error_s=0.0005,
    )


def test_a_believed_node_time_publishes_by_the_sooner_clock() -> None:
    read = readings()
    assert read.believed
    [due] = fence.due_mono([ANSWERED + 0.010], read)
    by_claim = 50.004 + 0.010  # the reading carried from when the answer was read
    by_node = 50.0 + 0.0005 + (ANSWERED + 0.010 - (ANSWERED - 0.003))
    assert due == pytest.approx(min(by_claim, by_node))
    assert due == pytest.approx(by_node)


def test_a_node_time_ahead_beyond_its_error_is_not_believed() -> None:
    read = readings(node_s=ANSWERED + 0.050)  # 50 ms ahead of PostgreSQL's reading
    assert read.ahead_s == pytest.approx(0.0495)
    assert not read.believed
    [due] = fence.due_mono([ANSWERED + 0.010], read)
    assert due == pytest.approx(50.004 + 0.010)  # the claim's reading alone


def test_a_step_of_the_node_time_during_the_claim_is_not_believed() -> None:
    read = readings(step_s=-0.5)
    assert read.moved_s == pytest.approx(-0.5)
    assert not read.believed
    assert fence.due_mono([ANSWERED], read) == [pytest.approx(50.004)]


def test_within_the_check_the_node_time_is_believed() -> None:
    assert readings(node_s=ANSWERED + fence.CLOCK_CHECK_S).believed
    assert readings(step_s=fence.CLOCK_CHECK_S / 2).believed


def test_no_job_goes_before_the_one_before_it() -> None:
    due = fence.due_mono([ANSWERED + 0.020, ANSWERED + 0.010, ANSWERED + 0.030], readings())
    assert due == sorted(due)
    assert due[1] == due[0]


def test_a_job_due_already_goes_as_soon_as_the_answer_is_read_or_sooner() -> None:
    [due] = fence.due_mono([ANSWERED - 5.0], readings())
    assert due <= 50.004
