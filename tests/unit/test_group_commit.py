"""Group commit's failure handling, with an insert function standing in for the store."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

from consumers_sdk import ids
from dispatcher import errors, models
from dispatcher.intake.group_commit import GroupCommit
from dispatcher.store import jobs as job_store

IDS = ids.JobIds()
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def new_job(routing_key: str) -> models.NewJob:
    spec = models.JobSpec(routing_key=routing_key, payload=b"1", run_at=NOW, headers={})
    return models.NewJob(id=IDS.next(), shard=0, spec=spec)


def stored(job: models.NewJob) -> models.Submitted:
    return models.Submitted(job=job_store.as_stored(job, NOW), outcome=models.Outcome.CREATED)


async def submit_together(
    group: GroupCommit, jobs: list[models.NewJob]
) -> list[models.Submitted | BaseException]:
    runner = asyncio.create_task(group.run())
    try:
        return await asyncio.gather(*(group.submit(job) for job in jobs), return_exceptions=True)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_job_that_breaks_the_shared_statement_fails_only_its_own_request() -> None:
    async def insert(jobs: Sequence[models.NewJob]) -> list[models.Submitted]:
        if any(job.spec.routing_key == "poison" for job in jobs):
            raise ValueError("a value the statement cannot take")
        return [stored(job) for job in jobs]

    jobs = [new_job("poison" if n == 3 else "fine") for n in range(8)]
    answers = await submit_together(GroupCommit(insert, max_batch=500, flushers=1), jobs)
    assert [isinstance(answer, ValueError) for answer in answers] == [n == 3 for n in range(8)]


async def test_a_database_away_fails_the_whole_group_at_once() -> None:
    calls = 0

    async def insert(jobs: Sequence[models.NewJob]) -> list[models.Submitted]:
        nonlocal calls
        calls += 1
        raise errors.StoreUnavailable("down")

    answers = await submit_together(
        GroupCommit(insert, max_batch=500, flushers=1), [new_job("a") for _ in range(5)]
    )
    assert all(isinstance(answer, errors.StoreUnavailable) for answer in answers)
    assert calls == 1  # not retried one by one: every request answers 503 at once
