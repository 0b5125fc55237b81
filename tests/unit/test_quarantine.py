"""Quarantine: suspects fire alone, strikes lead to parking, memory stays bounded."""

import uuid

from dispatcher.firing.quarantine import STRIKE_DELAY_S, Quarantine


def test_a_suspect_is_parked_at_its_third_strike_and_waits_longer_after_each() -> None:
    quarantine = Quarantine(max_strikes=3)
    job = uuid.uuid4()
    quarantine.suspect([job])
    assert job in quarantine
    assert quarantine.delay_s(job) == 0.0  # first tried alone at once
    assert quarantine.strike(job, "nack") is False  # a refusal aimed at it: always counts
    assert quarantine.delay_s(job) == STRIKE_DELAY_S
    assert quarantine.strike(job, "bad", progress=20) is False
    assert quarantine.delay_s(job) == 2 * STRIKE_DELAY_S
    assert quarantine.strike(job, "bad", progress=30) is True


def test_failing_while_nothing_else_fires_is_no_strike() -> None:
    quarantine = Quarantine(max_strikes=3)
    job = uuid.uuid4()
    for _ in range(10):  # everything fails: the figure of confirmed publishes stands still
        assert quarantine.strike(job, "the database is in a state of its own", progress=7) is False
    assert quarantine.delay_s(job) == STRIKE_DELAY_S


def test_a_suspect_that_fires_is_cleared() -> None:
    quarantine = Quarantine()
    jobs = [uuid.uuid4() for _ in range(3)]
    quarantine.suspect(jobs)
    quarantine.clear(jobs[:2])
    assert [job in quarantine for job in jobs] == [False, False, True]


def test_the_quarantine_forgets_its_oldest_suspects_when_full() -> None:
    quarantine = Quarantine(cap=100)
    jobs = [uuid.uuid4() for _ in range(250)]
    quarantine.suspect(jobs)
    assert len(quarantine) == 100
    assert jobs[-1] in quarantine
    assert jobs[0] not in quarantine
