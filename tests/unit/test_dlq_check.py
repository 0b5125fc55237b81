"""Which dead copies ``dlq requeue`` drops: a copy whose job was requeued after it died, or has
finished; never one whose job is still dead, still dispatched, or unknown to the dispatcher."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumers_sdk import contract, dlq
from consumers_sdk.dlq_check import drop_reason

DIED = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def document(state: str, *events: tuple[str, datetime]) -> dict[str, Any]:
    history = [{"event": name, "at": contract.format_run_at(at)} for name, at in events]
    return {"state": state, "history": history}


def test_a_job_requeued_after_its_copy_died_drops_the_copy_whatever_its_state() -> None:
    later = DIED + timedelta(minutes=5)
    for state in ("scheduled", "dispatched", "succeeded", "dead"):
        job = document(state, ("dead", DIED), ("requeued", later))
        assert drop_reason(job, dead_at=DIED) == "requeued", state


def test_a_copy_that_died_after_the_requeue_is_the_live_one() -> None:
    job = document("dead", ("requeued", DIED - timedelta(minutes=5)), ("dead", DIED))
    assert drop_reason(job, dead_at=DIED) is None


@pytest.mark.parametrize("state", ["succeeded", "cancelled", "expired"])
def test_a_finished_job_drops_its_copy(state: str) -> None:
    assert drop_reason(document(state), dead_at=DIED) == state


@pytest.mark.parametrize("state", ["dead", "dispatched"])
def test_a_job_still_dead_or_never_reported_dead_keeps_its_copy(state: str) -> None:
    assert drop_reason(document(state, ("dispatched", DIED)), dead_at=DIED) is None


def test_a_job_the_dispatcher_does_not_know_keeps_its_copy() -> None:
    assert drop_reason(None, dead_at=DIED) is None


def test_a_copy_without_its_death_time_yields_to_any_requeue() -> None:
    assert drop_reason(document("scheduled", ("requeued", DIED)), dead_at=None) == "requeued"


def test_the_result_says_how_many_were_dropped_and_why() -> None:
    done = dlq.Requeued(3, {"requeued": 2, "succeeded": 1}, checked=True)
    assert done.dropped_total == 3
    assert done.dropped_text() == (
        "dropped 3 dead copies of jobs requeued or finished since (requeued 2, succeeded 1)"
    )
    assert "not checked" in dlq.Requeued(3).dropped_text()
