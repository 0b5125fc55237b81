"""The dependency rows of a submission, written in the transaction that inserts its jobs; and the
batches that finish what the database's trigger deferred (``follow_deferred``)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import asyncpg

from dispatcher import models
from dispatcher.dependencies import plan as dependency_plan
from dispatcher.store.db import Database
from dispatcher.store.queries import dependencies as queries

# A batch of a follow-up may wait for dependents' row locks: longer than an API call.
FOLLOW_TIMEOUT_S = 30.0


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
    submitters = {(job.namespace, job.routing_scope) for job in jobs}
    assert len(submitters) == 1, "one submission is stored by one key, in one namespace"
    wanted = dependency_plan.prerequisites(jobs, created)
    states: dict[uuid.UUID, models.JobState] = {}
    if wanted:
        scope = jobs[0].routing_scope
        rows = await connection.fetch(
            queries.LOCK_PREREQUISITES,
            wanted,
            jobs[0].namespace or "",
            list(scope) if scope is not None else None,
        )
        states = {row["id"]: models.JobState(row["state"]) for row in rows}
    plan = dependency_plan.plan(jobs, resolved=resolved, created=created, states=states)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Followed:
    """One batch of a deferred follow-up: how many dependents it released or cancelled (a
    cancel's own cascade, made by the trigger, is not counted), and whether it was the last."""

    prerequisite_id: uuid.UUID
    released: int
    cancelled: int
    done: bool


async def follow_deferred(db: Database, *, batch: int) -> Followed | None:
    """Follow the next ``batch`` dependents of the oldest deferred follow-up, in one transaction;
    None when none waits (or other nodes hold them all)."""
    async with db.connection(FOLLOW_TIMEOUT_S) as connection, connection.transaction():
        followup = await connection.fetchrow(queries.CLAIM_FOLLOWUP)
        if followup is None:
            return None
        row = await connection.fetchrow(
            queries.FOLLOW_DEPENDENTS,
            followup["prerequisite_id"],
            followup["state"],
            followup["created_at"],
            followup["cursor"],
            batch,
        )
        assert row is not None  # an aggregate: always one row
        done = row["followed"] < batch
        if done:
            await connection.execute(queries.DELETE_FOLLOWUP, followup["id"])
        else:
            await connection.execute(queries.ADVANCE_FOLLOWUP, followup["id"], row["last_job_id"])
    return Followed(
        prerequisite_id=followup["prerequisite_id"],
        released=row["released"],
        cancelled=row["cancelled"],
        done=done,
    )
