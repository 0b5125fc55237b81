"""The dependency rows of a submission, written in the transaction that inserts its jobs."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence

import asyncpg

from dispatcher import dependencies, models
from dispatcher.store import queries


async def attach(
    connection: asyncpg.pool.PoolConnectionProxy,
    jobs: Sequence[models.NewJob],
    *,
    resolved: Sequence[uuid.UUID],
    created: Collection[uuid.UUID],
) -> set[uuid.UUID]:
    """Lock and check the prerequisites the created jobs name, store their edges and move those
    still waiting for one to ``waiting``; returns their ids. InvalidPrerequisite (the caller's
    transaction is rolled back) when one cannot be waited for."""
    namespaces = {job.namespace for job in jobs}
    assert len(namespaces) == 1, "one submission is stored in one namespace"
    wanted = dependencies.prerequisites(jobs, created)
    states: dict[uuid.UUID, models.JobState] = {}
    if wanted:
        rows = await connection.fetch(queries.LOCK_PREREQUISITES, wanted, jobs[0].namespace or "")
        states = {row["id"]: models.JobState(row["state"]) for row in rows}
    plan = dependencies.plan(jobs, resolved=resolved, created=created, states=states)
    if plan.edges:
        await connection.execute(
            queries.INSERT_DEPENDENCIES,
            [edge.job_id for edge in plan.edges],
            [edge.prerequisite_id for edge in plan.edges],
            [edge.position for edge in plan.edges],
            [edge.satisfied for edge in plan.edges],
        )
    if plan.waiting:
        await connection.execute(
            queries.MARK_WAITING, list(plan.waiting), list(plan.waiting.values())
        )
    return set(plan.waiting)


async def prerequisites(
    connection: asyncpg.pool.PoolConnectionProxy, job_id: uuid.UUID
) -> list[tuple[uuid.UUID, bool]]:
    """(prerequisite, succeeded) for each job ``job_id`` named in its ``after``, in that order."""
    rows = await connection.fetch(queries.SELECT_PREREQUISITES, job_id)
    return [(row["prerequisite_id"], row["satisfied"]) for row in rows]
