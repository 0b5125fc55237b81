"""Dependents beyond the trigger's budget, against a real PostgreSQL: a prerequisite with 100 000
dependents costs its event one queued follow-up, other events are recorded meanwhile, and the
background follow-up releases or cancels every dependent (transitively) in bounded batches."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dispatcher import metrics
from dispatcher.dependencies.followup import DependentsFollower
from tests.support.dependencies import Stores, event, open_stores
from tests.support.nodes import running_node
from tests.support.waiting import until

FAN_OUT = 100_000
BUDGET = 1000  # dependents the trigger follows inline per transaction (sql/0010)


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[Stores]:
    async with open_stores(database_url) as opened:
        yield opened


def follower(stores: Stores, batch: int = 1000) -> DependentsFollower:
    return DependentsFollower(stores.db, metrics.Metrics(), batch=batch, poll_s=0.05)


async def fan_out(stores: Stores, prerequisite: uuid.UUID, count: int) -> list[uuid.UUID]:
    """``count`` jobs waiting for ``prerequisite`` alone, stored in one statement (as ``count``
    submissions naming it would leave them)."""
    rows = await stores.sql.fetch(
        """
        WITH made AS (
            INSERT INTO jobs (id, shard, routing_key, payload, run_at, state, waiting_for)
            SELECT gen_random_uuid(), n % 8, 'orders.expire', '\\x7b7d', now(), 'waiting', 1
            FROM generate_series(1, $2) AS n
            RETURNING id
        ), edges AS (
            INSERT INTO job_dependencies (job_id, prerequisite_id, position)
            SELECT id, $1, 0 FROM made
        )
        SELECT id FROM made
        """,
        prerequisite,
        count,
    )
    await stores.sql.execute("UPDATE jobs SET has_dependents = true WHERE id = $1", prerequisite)
    return [row["id"] for row in rows]


async def count_in(stores: Stores, ids: list[uuid.UUID], state: str) -> int:
    return int(
        await stores.sql.fetchval(
            "SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[]) AND state = $2", ids, state
        )
    )


async def some_in(stores: Stores, ids: list[uuid.UUID], state: str) -> bool:
    return await count_in(stores, ids, state) > 0


async def queued(stores: Stores) -> int:
    return int(await stores.sql.fetchval("SELECT count(*) FROM dependency_followups"))


async def test_a_prerequisite_with_100_000_dependents_does_not_hold_up_event_recording(
    stores: Stores, database_url: str
) -> None:
    a = await stores.submit()
    dependents = await fan_out(stores, a.id, FAN_OUT)
    other = await stores.submit()
    waiting_for_other = await stores.submit(other.id)
    await stores.dispatched(a.id, other.id)
    notices: list[str] = []
    listener = await asyncpg.connect(database_url)
    await listener.add_listener("dispatcher_due", lambda *args: notices.append(args[3]))
    # The event's transaction queues the follow-up instead of making 100 000 changes (counted
    # before the follower starts: its first batch may come before a count taken after).
    await stores.report(a.id, "succeeded")
    assert await stores.states(a.id) == ["succeeded"]
    assert await count_in(stores, dependents, "scheduled") == 0
    assert await queued(stores) == 1
    worker = follower(stores)
    task = asyncio.create_task(worker.run(), name="test-dependents")
    try:
        # Another job's event, recorded while the follow-up works: not held up behind it.
        await until(lambda: some_in(stores, dependents, "scheduled"), 30)
        await stores.report(other.id, "succeeded")
        assert await stores.states(waiting_for_other.id) == ["scheduled"]
        assert await count_in(stores, dependents, "waiting") > 0  # still working meanwhile

        async def finished() -> bool:
            return not await queued(stores) and len(notices) > FAN_OUT

        await until(finished, 240)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        await listener.close()
    assert await count_in(stores, dependents, "scheduled") == FAN_OUT
    assert (
        await stores.sql.fetchval(
            "SELECT count(*) FROM job_dependencies WHERE prerequisite_id = $1 AND satisfied", a.id
        )
        == FAN_OUT
    )
    # One due notice per released job, the 0006 format: the owning node loads each at once.
    assert {notice.split(",")[0] for notice in notices} == {
        str(job_id) for job_id in [*dependents, waiting_for_other.id]
    }


async def test_a_dead_prerequisite_with_100_000_dependents_cancels_them_all_transitively(
    stores: Stores,
) -> None:
    a = await stores.submit()
    dependents = await fan_out(stores, a.id, FAN_OUT)
    # Some of them have dependents of their own: 1500 under one (past the inline budget too),
    # and a chain under another.
    deep = await fan_out(stores, dependents[0], 1500)
    chained = await stores.submit(dependents[1])
    end = await stores.submit(chained.id)
    await stores.dispatched(a.id)
    await stores.report(a.id, "dead")
    assert await count_in(stores, dependents, "waiting") == FAN_OUT  # queued, not done inline
    assert await follower(stores).drain() >= FAN_OUT
    assert await count_in(stores, dependents, "cancelled") == FAN_OUT
    assert await count_in(stores, deep, "cancelled") == 1500
    assert await stores.state(dependents[7]) == ("cancelled", f"prerequisite {a.id} dead")
    assert await stores.state(deep[0]) == ("cancelled", f"prerequisite {dependents[0]} cancelled")
    assert await stores.state(end.id) == ("cancelled", f"prerequisite {chained.id} cancelled")
    assert await queued(stores) == 0


async def test_a_long_chain_is_cancelled_to_its_end(stores: Stores) -> None:
    """Each cancel's trigger follows the next link, nested; past 16 nested triggers the rest is
    queued (deeper, PostgreSQL's stack would run out and fail the event's transaction)."""
    head = await stores.submit()
    chain = [head]
    for _ in range(40):
        chain.append(await stores.submit(chain[-1].id))
    await stores.dispatched(head.id)
    await stores.report(head.id, "dead")
    ids = [job.id for job in chain[1:]]
    assert 0 < await count_in(stores, ids, "cancelled") < len(ids)
    await follower(stores).drain()
    assert await count_in(stores, ids, "cancelled") == len(ids)
    assert await stores.state(chain[-1].id) == (
        "cancelled",
        f"prerequisite {chain[-2].id} cancelled",
    )


async def test_the_trigger_follows_at_most_its_budget_per_transaction(stores: Stores) -> None:
    """Three prerequisites of 600 dependents each succeed in one batch of events: the first one
    the trigger meets is followed inline, the other two would pass the budget and are queued."""
    prerequisites = [await stores.submit() for _ in range(3)]
    fans = [await fan_out(stores, p.id, 600) for p in prerequisites]
    await stores.dispatched(*(p.id for p in prerequisites))
    await stores.history.record(
        [
            event(p.id, "succeeded", dispatch_round=await stores.round_of(p.id))
            for p in prerequisites
        ]
    )
    released = sorted([await count_in(stores, fan, "scheduled") for fan in fans])
    assert released == [0, 0, 600]
    assert await queued(stores) == 2
    assert await follower(stores).drain() == 1200
    assert [await count_in(stores, fan, "scheduled") for fan in fans] == [600] * 3


async def test_a_requeued_prerequisite_succeeding_during_its_cancel_follow_up(
    stores: Stores,
) -> None:
    """Its follow-ups are worked in order: the dependents its death doomed are cancelled, the one
    submitted after the requeue is released."""
    a = await stores.submit()
    doomed = await fan_out(stores, a.id, BUDGET + 500)
    await stores.dispatched(a.id)
    await stores.report(a.id, "dead")
    await stores.jobs.requeue(a.id, shard=0)
    later = await stores.submit(a.id)
    await stores.dispatched(a.id)
    await stores.report(a.id, "succeeded")
    assert await queued(stores) == 2
    await follower(stores, batch=400).drain()
    assert await count_in(stores, doomed, "cancelled") == len(doomed)
    assert await stores.state(later.id) == ("scheduled", None)
    assert await queued(stores) == 0


async def test_the_follower_stops_when_asked(stores: Stores) -> None:
    worker = follower(stores)
    task = asyncio.create_task(worker.run(), name="test-dependents")
    await asyncio.sleep(0.2)
    assert not task.done()  # it waits for its next look
    worker.stop()
    await asyncio.wait_for(task, 5)


async def test_a_node_follows_what_the_trigger_queued_and_fires_the_released_jobs(
    stores: Stores, database_url: str, amqp_url: str
) -> None:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="dependents",
        shard_count=8,
        dependents_poll_s=0.1,
        sweep_grace_s=120,  # released jobs fire from their due notices, not the safety sweep
    ) as node:
        a = await stores.submit()
        dependents = await fan_out(stores, a.id, BUDGET + 500)
        await stores.dispatched(a.id)
        await stores.report(a.id, "succeeded")
        assert await queued(stores) == 1

        async def all_dispatched() -> bool:
            return await count_in(stores, dependents, "dispatched") == len(dependents)

        await until(all_dispatched, 60)
        assert await queued(stores) == 0
        rendered = node.core.metrics.render().decode()
    assert f'dispatcher_dependents_followed_total{{outcome="released"}} {len(dependents)}.0' in (
        rendered
    )
