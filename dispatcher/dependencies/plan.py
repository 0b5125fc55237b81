"""Job dependencies (``after``): the edges a submission creates and the jobs that start waiting.

Pure: the store locks the prerequisites and passes their states in; the database does the rest
(``sql/0006_dependencies.sql``: release when the last prerequisite succeeds, cancel when one dies,
is cancelled or expires, in the transaction of that change).

Why no cycle can form: job ids are assigned by the server, a job may only name jobs that exist
(committed, in its namespace) when it is submitted, and its ``after`` never changes afterwards.
So every edge points from a new job to an older one. The only ways to name a job that did not
exist before the request are refused here explicitly: the job itself or another job of the same
request (their ids are only made up by the server, so a caller can only name them by chance),
and the job an idempotency key resolves to (a resubmission naming the job it repeats). Items of
one batch cannot wait for each other: submit the prerequisites first.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from dispatcher import errors, models

MAX_AFTER = 100  # prerequisites one job may name

# A prerequisite in one of these can never succeed (a dead one only by a requeue, which does not
# bring back the jobs cancelled because it died).
FAILED = frozenset({models.JobState.DEAD, models.JobState.CANCELLED, models.JobState.EXPIRED})


@dataclass(frozen=True, slots=True)
class Edge:
    job_id: uuid.UUID
    prerequisite_id: uuid.UUID
    position: int
    satisfied: bool


@dataclass(slots=True)
class Plan:
    edges: list[Edge] = field(default_factory=list)
    waiting: dict[uuid.UUID, int] = field(default_factory=dict)  # job -> prerequisites pending


def repeated(after: Sequence[uuid.UUID]) -> tuple[int, int] | None:
    """(index, index of its first occurrence) of the first id named twice, else None."""
    seen: dict[uuid.UUID, int] = {}
    for index, job_id in enumerate(after):
        if job_id in seen:
            return index, seen[job_id]
        seen[job_id] = index
    return None


def prerequisites(jobs: Sequence[models.NewJob], created: Collection[uuid.UUID]) -> list[uuid.UUID]:
    """The jobs to lock and look up: those the newly created jobs name, in id order."""
    return sorted({p for job in jobs if job.id in created for p in job.spec.after})


def plan(
    jobs: Sequence[models.NewJob],
    *,
    resolved: Sequence[uuid.UUID],
    created: Collection[uuid.UUID],
    states: Mapping[uuid.UUID, models.JobState],
) -> Plan:
    """The edges of the jobs created, and which of them wait; InvalidPrerequisite otherwise.

    ``resolved[k]`` is the job submission ``k`` stands for (its new id, or the job found under its
    idempotency key); ``states`` the prerequisites found in the submission's namespace.
    """
    result = Plan()
    for index, job in enumerate(jobs):
        own = resolved[index]
        for position, prerequisite in enumerate(job.spec.after):
            if prerequisite == own:
                known = "" if own in created else " (stored earlier under this idempotency_key)"
                raise errors.InvalidPrerequisite(index, position, f"is this job itself{known}")
            if prerequisite in created:
                raise errors.InvalidPrerequisite(
                    index,
                    position,
                    "is a job of this same request; a job can only wait for jobs that exist",
                )
        if own not in created:
            continue  # the job stored earlier is returned as it is, with its own `after`
        pending = 0
        for position, prerequisite in enumerate(job.spec.after):
            state = states.get(prerequisite)
            if state is None:
                raise errors.InvalidPrerequisite(
                    index, position, f"no job {prerequisite} in this namespace"
                )
            if state in FAILED:
                raise errors.InvalidPrerequisite(
                    index, position, f"job {prerequisite} is {state.value}: it cannot succeed"
                )
            satisfied = state is models.JobState.SUCCEEDED
            pending += not satisfied
            result.edges.append(Edge(own, prerequisite, position, satisfied))
        if pending:
            result.waiting[own] = pending
    return result
