"""The fence between a claim and the changes of pending jobs (sql/0029): a claim holds its shards'
rows of ``shard_epochs`` FOR SHARE, a cancel, a reschedule, a bulk batch and a replace FOR NO
KEY UPDATE, each before it reads the jobs. So each waits for the other on a shard they share,
even for jobs the other does not touch, and then reads what the other committed: the property a
claim that writes no job row will rest on. Real PostgreSQL; transactions held open by the test
stand for the other statement caught half way."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable

import asyncpg
import pytest

from dispatcher import errors, models
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore
from dispatcher.store.queries import bulk_actions, job_reads, scheduler
from dispatcher.store.shards import ShardStore
from tests.integration.test_store import due, new_job

NODE = "fence-node"
# Long enough for a statement that does not wait to have finished many times over.
WAITS_S = 0.5


@pytest.fixture
async def store(db: Database) -> JobStore:
    await ShardStore(db).ensure(4)
    return JobStore(db, node_id=NODE, lease_s=30)


@pytest.fixture
async def other(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The other statement's session, whose transaction the test holds open."""
    connection = await asyncpg.connect(database_url)
    yield connection
    await connection.close()


async def waits(statement: Awaitable[object]) -> asyncio.Task[object]:
    """The statement started, and still waiting after ``WAITS_S``."""
    task: asyncio.Task[object] = asyncio.ensure_future(statement)
    done, _ = await asyncio.wait([task], timeout=WAITS_S)
    assert not done, f"did not wait: {task.result() if not task.exception() else task}"
    return task


async def claim_held_open(
    connection: asyncpg.Connection, jobs: list[models.NewJob], epochs: dict[int, int]
) -> None:
    """A claim of these jobs, its transaction left open."""
    shards = sorted(epochs)
    await connection.execute("BEGIN")
    rows = await connection.fetch(
        scheduler.CLAIM_JOBS,
        [job.id for job in jobs],
        shards,
        [epochs[shard] for shard in shards],
        NODE,
        30.0,
        [job.spec.run_at.timestamp() for job in jobs],
        0.0,
        "[]",
        [],
        [],
    )
    assert {row["id"] for row in rows} == {job.id for job in jobs}


async def test_a_claim_waits_while_a_change_holds_its_shard_and_then_reads_what_it_did(
    store: JobStore, db: Database, other: asyncpg.Connection
) -> None:
    cancelled, untouched = new_job(shard=1), new_job(shard=1)
    await store.insert([cancelled, untouched])
    epochs = await ShardStore(db).bump([1], NODE)

    await other.execute("BEGIN")
    assert await other.fetchval(job_reads.FENCE_JOB, cancelled.id) == 1
    # A claim of a job the change has not touched waits too: the fence is the shard's.
    claim = await waits(store.claim(due(untouched), epochs))
    await other.fetchrow(job_reads.CANCEL_JOB, cancelled.id, None, None, 1)
    await other.execute("COMMIT")
    assert [job.id for job in (await claim).jobs] == [untouched.id]  # type: ignore[attr-defined]

    # Caught after its change, before its commit: the claim reads the job cancelled.
    again = new_job(shard=1)
    await store.insert([again])
    await other.execute("BEGIN")
    await other.fetchval(job_reads.FENCE_JOB, again.id)
    await other.fetchrow(job_reads.CANCEL_JOB, again.id, None, None, 1)
    claim = await waits(store.claim(due(again), epochs))
    await other.execute("COMMIT")
    assert (await claim).jobs == []  # type: ignore[attr-defined]
    assert (await store.get(again.id)).state is models.JobState.CANCELLED


async def test_a_claim_of_another_shard_does_not_wait(
    store: JobStore, db: Database, other: asyncpg.Connection
) -> None:
    held, elsewhere = new_job(shard=1), new_job(shard=2)
    await store.insert([held, elsewhere])
    epochs = await ShardStore(db).bump([1, 2], NODE)
    await other.execute("BEGIN")
    await other.fetchval(job_reads.FENCE_JOB, held.id)
    claim = await asyncio.wait_for(store.claim(due(elsewhere), {2: epochs[2]}), WAITS_S)
    await other.execute("COMMIT")
    assert [job.id for job in claim.jobs] == [elsewhere.id]


async def test_a_cancel_or_a_reschedule_waits_for_a_claim_under_way_on_the_jobs_shard(
    store: JobStore, db: Database, other: asyncpg.Connection
) -> None:
    claimed, beside, moved = new_job(shard=3), new_job(shard=3), new_job(shard=3)
    await store.insert([claimed, beside, moved])
    epochs = await ShardStore(db).bump([3], NODE)
    await claim_held_open(other, [claimed], epochs)

    cancel = await waits(store.cancel(beside.id))
    later = moved.spec.run_at.replace(year=2030)
    reschedule = await waits(store.reschedule(moved.id, models.JobChange(run_at=later)))
    await other.execute("COMMIT")
    assert (await cancel).state is models.JobState.CANCELLED  # type: ignore[attr-defined]
    assert (await reschedule).run_at == later  # type: ignore[attr-defined]
    with pytest.raises(errors.JobStateConflict) as caught:
        await store.cancel(claimed.id)
    assert caught.value.state == "dispatching"


async def test_a_bulk_batch_waits_for_a_claim_under_way_on_its_shards(
    store: JobStore, db: Database, other: asyncpg.Connection
) -> None:
    claimed, beside = new_job(shard=0), new_job(shard=2)
    await store.insert([claimed, beside])
    epochs = await ShardStore(db).bump([0, 2], NODE)
    await claim_held_open(other, [claimed], {0: epochs[0]})

    async def batch() -> list[uuid.UUID]:
        """A bulk cancel's batch of every scheduled job, as the runner makes it."""
        filter_ = ["scheduled", None, *[None] * 9]
        async with db.connection() as connection, connection.transaction():
            picked = await connection.fetchrow(
                bulk_actions.BULK_FENCE, uuid.UUID(int=0), 10, *filter_
            )
            assert picked is not None
            assert sorted(picked["shards"]) == [0, 2]
            await connection.fetchrow(
                bulk_actions.BULK_CANCEL, picked["ids"], picked["shards"], *filter_, NODE, "x"
            )
            rows = await connection.fetch("SELECT id FROM jobs WHERE state = 'cancelled'")
        return [row["id"] for row in rows]

    cancel = await waits(batch())
    await other.execute("COMMIT")
    assert await cancel == [beside.id]
    assert (await store.get(claimed.id)).state is models.JobState.DISPATCHING


async def test_a_replace_waits_for_a_claim_under_way_on_the_shard_of_the_job_its_key_names(
    store: JobStore, db: Database, other: asyncpg.Connection
) -> None:
    first = new_job(shard=1, key="fenced-key")
    await store.insert([first])
    epochs = await ShardStore(db).bump([1], NODE)
    await claim_held_open(other, [first], epochs)

    replacement = new_job(shard=1, key="fenced-key")
    replacement = dataclasses.replace(
        replacement,
        spec=dataclasses.replace(replacement.spec, on_existing=models.OnExisting.REPLACE),
    )
    insert = await waits(store.insert([replacement]))
    await other.execute("COMMIT")
    [answer] = await insert  # type: ignore[misc]
    assert answer.job.id == first.id
    assert answer.outcome is models.Outcome.REFUSED  # in flight: it goes out as it was claimed


async def test_the_claim_answers_its_clocks_then_the_claimed_columns_in_order(
    store: JobStore, db: Database, other: asyncpg.Connection
) -> None:
    """``claimed_from_row`` reads the function's row by position: its columns are pinned here by
    name (the job's values, by ``test_store``)."""
    job = new_job(shard=2)
    await store.insert([job])
    epochs = await ShardStore(db).bump([2], NODE)
    await claim_held_open(other, [job], epochs)
    await other.execute("ROLLBACK")
    row = await other.fetchrow(scheduler.CLAIM_JOBS, [], [], [], NODE, 30.0, [], 0.0, "[]", [], [])
    assert row is not None
    assert list(row.keys()) == ["fenced_at_s", "answered_at_s", *scheduler.CLAIMED_COLUMNS]
