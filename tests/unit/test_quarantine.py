"""Quarantine: suspects fire alone, strikes lead to parking, memory stays bounded."""

import uuid

from dispatcher.scheduler.quarantine import STRIKE_DELAY_S, Quarantine


def test_a_suspect_is_parked_at_its_third_strike_and_waits_longer_after_each() -> None:
    quarantine = Quarantine(max_strikes=3)
    job = uuid.uuid4()
    quarantine.suspect([job])
    assert job in quarantine
    assert quarantine.delay_s(job) == 0.0  # first tried alone at once
    assert quarantine.strike(job, "bad") is False
    assert quarantine.delay_s(job) == STRIKE_DELAY_S
    assert quarantine.strike(job, "bad") is False
    assert quarantine.delay_s(job) == 2 * STRIKE_DELAY_S
    assert quarantine.strike(job, "bad") is True


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
