"""When a firing worker with nothing to take wakes: ahead of the next live job by the claim's
lead when it claims ahead, at the job's due time when it holds overdue jobs (which claim nothing
ahead)."""

import pytest

from dispatcher.firing.lanes import CLAIM_LEAD_S, wake_in_s


def test_a_worker_that_claims_ahead_wakes_the_claims_lead_before_the_next_job() -> None:
    assert wake_in_s(10.0, 9.0, claims_ahead=True) == pytest.approx(1.0 - CLAIM_LEAD_S)
    assert wake_in_s(10.0, 10.0 - CLAIM_LEAD_S / 2, claims_ahead=True) == 0.0  # take it now


def test_a_worker_with_overdue_jobs_waits_for_the_next_live_job_to_be_due() -> None:
    # Inside the lead it would find nothing due to take: it must not wake at once over and over.
    assert wake_in_s(10.0, 10.0 - CLAIM_LEAD_S / 2, claims_ahead=False) == pytest.approx(
        CLAIM_LEAD_S / 2
    )
    assert wake_in_s(10.0, 11.0, claims_ahead=False) == 0.0


def test_a_worker_with_no_live_job_waits_to_be_woken() -> None:
    assert wake_in_s(None, 9.0, claims_ahead=True) is None
    assert wake_in_s(None, 9.0, claims_ahead=False) is None
