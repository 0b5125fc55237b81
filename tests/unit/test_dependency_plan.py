"""The pure part of job dependencies: which edges a submission makes, which jobs wait, and what is
refused (naming the job and the position in its `after`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from consumers_sdk import ids
from dispatcher import errors, models
from dispatcher.dependencies import plan as dependency_plan

IDS = ids.JobIds()
S = models.JobState


def new_job(*after: uuid.UUID, job_id: uuid.UUID | None = None) -> models.NewJob:
    spec = models.JobSpec(
        routing_key="k", payload=b"{}", run_at=datetime.now(UTC), headers={}, after=after
    )
    return models.NewJob(id=job_id or IDS.next(), shard=0, spec=spec)


def plan(
    jobs: Sequence[models.NewJob],
    states: dict[uuid.UUID, models.JobState],
    resolved: Sequence[uuid.UUID] | None = None,
) -> dependency_plan.Plan:
    ids = [job.id for job in jobs]
    return dependency_plan.plan(
        jobs, resolved=resolved or ids, created=set(resolved or ids) & set(ids), states=states
    )


def test_repeated_names_the_second_occurrence_and_the_first() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    assert dependency_plan.repeated([a, b]) is None
    assert dependency_plan.repeated([a, b, a]) == (2, 0)


def test_a_job_waits_for_the_prerequisites_not_yet_succeeded() -> None:
    done, running, future = IDS.next(), IDS.next(), IDS.next()
    waiting, ready = new_job(done, running, future), new_job(done)
    result = plan([waiting, ready], {done: S.SUCCEEDED, running: S.DISPATCHED, future: S.WAITING})
    assert result.waiting == {waiting.id: 2}
    assert [(e.job_id, e.prerequisite_id, e.position, e.satisfied) for e in result.edges] == [
        (waiting.id, done, 0, True),
        (waiting.id, running, 1, False),
        (waiting.id, future, 2, False),
        (ready.id, done, 0, True),
    ]


def test_prerequisites_to_lock_are_those_of_created_jobs_in_id_order() -> None:
    a, b, c = IDS.next(), IDS.next(), IDS.next()
    fresh, repeated = new_job(c, a), new_job(b)
    assert dependency_plan.prerequisites([fresh, repeated], {fresh.id}) == [a, c]


@pytest.mark.parametrize("state", [S.DEAD, S.CANCELLED, S.EXPIRED])
def test_a_prerequisite_that_cannot_succeed_is_refused(state: models.JobState) -> None:
    ok, doomed = IDS.next(), IDS.next()
    with pytest.raises(errors.InvalidPrerequisite, match=state.value) as refused:
        plan([new_job(), new_job(ok, doomed)], {ok: S.SCHEDULED, doomed: state})
    assert (refused.value.job_index, refused.value.after_index) == (1, 1)


def test_an_unknown_prerequisite_is_refused() -> None:
    with pytest.raises(errors.InvalidPrerequisite, match="no job") as refused:
        plan([new_job(IDS.next())], {})
    assert (refused.value.job_index, refused.value.after_index) == (0, 0)


def test_the_job_itself_or_another_job_of_the_request_is_refused() -> None:
    own = IDS.next()
    with pytest.raises(errors.InvalidPrerequisite, match="itself"):
        plan([new_job(own, job_id=own)], {own: S.SCHEDULED})
    first = new_job()
    with pytest.raises(errors.InvalidPrerequisite, match="same request") as refused:
        plan([first, new_job(first.id)], {first.id: S.SCHEDULED})
    assert (refused.value.job_index, refused.value.after_index) == (1, 0)


def test_a_submission_resolved_by_its_key_adds_no_edge_but_may_not_name_that_job() -> None:
    stored, other = IDS.next(), IDS.next()
    repeat = new_job(other)
    result = plan([repeat], {other: S.SCHEDULED}, resolved=[stored])
    assert (result.edges, result.waiting) == ([], {})
    with pytest.raises(errors.InvalidPrerequisite, match="idempotency_key"):
        plan([new_job(stored)], {stored: S.SCHEDULED}, resolved=[stored])
