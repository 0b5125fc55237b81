"""Job dependencies in the store against a real PostgreSQL: the edges a submission writes, and the
release or cancellation the 0006 trigger makes in the transaction of a prerequisite's change."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dispatcher import errors, models
from dispatcher.store import due_notices
from tests.support.dependencies import IDS, Stores, new_job, open_stores


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[Stores]:
    async with open_stores(database_url) as opened:
        yield opened


async def test_a_job_waits_until_its_prerequisite_succeeded_then_is_scheduled_with_its_run_at(
    stores: Stores, database_url: str
) -> None:
    a = await stores.submit()
    later = datetime.now(UTC) + timedelta(hours=1)
    b = await stores.submit(a.id, run_at=later)
    assert b.state is models.JobState.WAITING
    assert await stores.state(b.id) == ("waiting", None)
    assert await stores.jobs.prerequisites(b.id) == [(a.id, False)]
    # Never loaded while waiting, even once due.
    entries, _ = await stores.jobs.load_due(
        [0], after=(datetime(1970, 1, 1, tzinfo=UTC), uuid.UUID(int=0)),
        until=later + timedelta(days=1), limit=10,
    )  # fmt: skip
    assert [entry.id for entry in entries] == [a.id]

    listener = await asyncpg.connect(database_url)
    notified: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("dispatcher_due", lambda *args: notified.put_nowait(args[3]))
    try:
        await stores.dispatched(a.id)
        await stores.report(a.id, "started")
        assert await stores.state(b.id) == ("waiting", None)
        await stores.report(a.id, "succeeded")
        assert await stores.state(b.id) == ("scheduled", None)
        # The owning node hears of it (a due notice).
        payload = await asyncio.wait_for(notified.get(), 5)
    finally:
        await listener.close()
    entry = due_notices.parse(payload)
    assert entry is not None
    assert (entry.id, entry.shard, entry.key) == (b.id, b.shard, b.routing_key)
    assert entry.run_at_s == pytest.approx(later.timestamp(), abs=1e-3)
    assert (await stores.jobs.get(b.id)).run_at == b.run_at  # kept
    assert await stores.jobs.prerequisites(b.id) == [(a.id, True)]


async def test_a_prerequisite_already_succeeded_schedules_the_job_straight_away(
    stores: Stores,
) -> None:
    a = await stores.submit()
    await stores.dispatched(a.id)
    await stores.report(a.id, "succeeded")
    b = await stores.submit(a.id)
    assert b.state is models.JobState.SCHEDULED
    assert await stores.state(b.id) == ("scheduled", None)
    assert await stores.jobs.prerequisites(b.id) == [(a.id, True)]


async def test_repeated_success_events_count_once_and_the_last_prerequisite_releases(
    stores: Stores,
) -> None:
    a, c = await stores.submit(), await stores.submit()
    d = await stores.submit(a.id, c.id)
    await stores.dispatched(a.id, c.id)
    first = str(uuid.uuid4())
    await stores.report(a.id, "succeeded", first)
    await stores.report(a.id, "succeeded", first)  # redelivered
    await stores.report(a.id, "succeeded")  # another consumer's report of the same success
    assert await stores.state(d.id) == ("waiting", None)
    await stores.report(c.id, "succeeded")
    assert await stores.state(d.id) == ("scheduled", None)


async def test_prerequisites_succeeding_at_once_release_their_dependent_exactly_once(
    stores: Stores,
) -> None:
    """Two transactions each satisfy one edge: the dependent's row lock orders them."""
    for _ in range(10):
        a, b = await stores.submit(), await stores.submit()
        d = await stores.submit(a.id, b.id)
        await stores.dispatched(a.id, b.id)
        await asyncio.gather(stores.report(a.id, "succeeded"), stores.report(b.id, "succeeded"))
        assert await stores.state(d.id) == ("scheduled", None)
        waiting_for = await stores.sql.fetchval("SELECT waiting_for FROM jobs WHERE id = $1", d.id)
        assert waiting_for == 0


async def test_a_submission_racing_its_prerequisites_success_is_never_left_waiting(
    stores: Stores,
) -> None:
    """The submission locks the prerequisite: its success either commits first (the job is
    scheduled at once) or waits for the edge (and releases it)."""
    for _ in range(10):
        a = await stores.submit()
        await stores.dispatched(a.id)
        b, _ = await asyncio.gather(stores.submit(a.id), stores.report(a.id, "succeeded"))
        assert await stores.state(b.id) == ("scheduled", None)


async def test_a_dead_prerequisite_cancels_the_whole_chain_with_reasons(stores: Stores) -> None:
    a = await stores.submit()
    b = await stores.submit(a.id)
    c = await stores.submit(b.id)
    other = await stores.submit()
    d = await stores.submit(other.id, c.id)
    await stores.dispatched(a.id)
    await stores.report(a.id, "dead")
    assert await stores.state(b.id) == ("cancelled", f"prerequisite {a.id} dead")
    assert await stores.state(c.id) == ("cancelled", f"prerequisite {b.id} cancelled")
    assert await stores.state(d.id) == ("cancelled", f"prerequisite {c.id} cancelled")
    assert await stores.states(other.id) == ["scheduled"]  # not waiting for anything


async def test_a_diamond_is_released_once_both_sides_succeeded(stores: Stores) -> None:
    a = await stores.submit()
    b, c = await stores.submit(a.id), await stores.submit(a.id)
    d = await stores.submit(b.id, c.id)
    await stores.dispatched(a.id)
    await stores.report(a.id, "succeeded")
    assert await stores.states(b.id, c.id, d.id) == ["scheduled", "scheduled", "waiting"]
    await stores.dispatched(b.id, c.id)
    await stores.report(b.id, "succeeded")
    assert await stores.states(d.id) == ["waiting"]
    await stores.report(c.id, "succeeded")
    assert await stores.states(d.id) == ["scheduled"]


async def test_cancelling_a_prerequisite_or_a_waiting_job_cancels_what_waits_for_it(
    stores: Stores,
) -> None:
    a = await stores.submit()
    b = await stores.submit(a.id)
    c = await stores.submit(b.id)
    assert (await stores.jobs.cancel(b.id)).state is models.JobState.CANCELLED  # waiting
    assert await stores.state(c.id) == ("cancelled", f"prerequisite {b.id} cancelled")
    assert await stores.states(a.id) == ["scheduled"]
    d = await stores.submit(a.id)
    await stores.jobs.cancel(a.id)  # scheduled
    assert await stores.state(d.id) == ("cancelled", f"prerequisite {a.id} cancelled")


async def test_an_expired_prerequisite_cancels_its_dependents(stores: Stores) -> None:
    a = await stores.submit()
    b = await stores.submit(a.id)
    await stores.sql.execute("UPDATE jobs SET state = 'dispatching' WHERE id = $1", a.id)
    await stores.jobs.mark_expired([a.id])
    assert await stores.state(b.id) == ("cancelled", f"prerequisite {a.id} expired")


async def test_requeueing_a_dead_prerequisite_does_not_revive_its_cancelled_dependents(
    stores: Stores,
) -> None:
    a = await stores.submit()
    b = await stores.submit(a.id)
    await stores.dispatched(a.id)
    await stores.report(a.id, "dead")
    await stores.jobs.requeue(a.id, shard=0)
    await stores.dispatched(a.id)
    await stores.report(a.id, "succeeded")
    assert await stores.state(b.id) == ("cancelled", f"prerequisite {a.id} dead")


async def test_refused_prerequisites_store_nothing(stores: Stores) -> None:
    a = await stores.submit(namespace="team-a")
    dead = await stores.submit()
    await stores.dispatched(dead.id)
    await stores.report(dead.id, "dead")
    before = await stores.sql.fetchval("SELECT count(*) FROM jobs")
    sibling = new_job()
    cases: list[tuple[list[models.NewJob], tuple[int, int], str]] = [
        ([new_job(after=[uuid.uuid4()])], (0, 0), "no job"),
        ([new_job(), new_job(after=[dead.id])], (1, 0), "is dead"),
        ([new_job(after=[a.id])], (0, 0), "no job"),  # another namespace
        ([sibling, new_job(after=[sibling.id])], (1, 0), "same request"),
    ]
    self_id = IDS.next()
    cases.append(([new_job(job_id=self_id, after=[self_id])], (0, 0), "itself"))
    for jobs, (job_index, after_index), message in cases:
        with pytest.raises(errors.InvalidPrerequisite, match=message) as refused:
            await stores.jobs.insert(jobs)
        assert (refused.value.job_index, refused.value.after_index) == (job_index, after_index)
    assert await stores.sql.fetchval("SELECT count(*) FROM jobs") == before
    assert await stores.sql.fetchval("SELECT count(*) FROM job_dependencies") == 0


async def test_a_resubmission_naming_the_job_its_key_resolves_to_is_refused(
    stores: Stores,
) -> None:
    first = await stores.submit(key="k")
    with pytest.raises(errors.InvalidPrerequisite, match="itself"):
        await stores.submit(first.id, key="k")
    # Without naming itself, the key finds the job stored earlier, unchanged.
    other = await stores.submit()
    again = await stores.submit(other.id, key="k")
    assert again.id == first.id
    assert await stores.jobs.prerequisites(first.id) == []
