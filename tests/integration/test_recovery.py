"""Recovery never starves, on an in-process node against real PostgreSQL and RabbitMQ: while a
paced catch-up drains a large backlog, claims whose lease ran out and claims released by another
node fire long before the backlog is through (they have a lane of their own)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

import asyncpg

from devstack.collector import Collector
from dispatcher import models
from dispatcher.firing import lanes, pacing
from dispatcher.firing.loader import FULL_LOOK_SPACING, Loader, SweepTimes, WindowLimits
from dispatcher.flow.rules import NOTHING_HELD, HeldKeys
from dispatcher.store.db import Database
from dispatcher.store.jobs import EVER, JobStore
from dispatcher.store.shards import ShardStore
from tests.support.claims import CLAIM_BY_HAND
from tests.support.nodes import running_node
from tests.support.overdue import insert_overdue

SHARDS = 8
KEY = "recovery.work"  # one routing key for all: the backlog's turns cannot help the others


async def claim_as_ghost(database_url: str, ids: list[str], lease_s: float) -> None:
    """What a node that died (or lost the shards) leaves: the jobs claimed under its name."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(CLAIM_BY_HAND, ids, "ghost", lease_s, None, None)
    finally:
        await connection.close()


async def test_expired_leases_and_released_claims_fire_long_before_a_paced_backlog_drains(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    # The oldest jobs of all are the ones recovered: in the backlog's order they would come first,
    # yet, claimed elsewhere when the catch-up starts, only recovery can bring them back.
    jobs = list(await insert_overdue(database_url, 3040, SHARDS, spacing_ms=10, routing_key=KEY))
    expiring, released, backlog = jobs[:20], jobs[20:40], jobs[40:]
    await claim_as_ghost(database_url, expiring, lease_s=1.0)
    await claim_as_ghost(database_url, released, lease_s=600.0)
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=SHARDS,
        catchup_max_rate=200,  # 3000 overdue jobs take 15 s
        lease_s=4,
        fire_batch=50,
    ):
        assert await collector.wait_for_count(100, 30) == 0  # the catch-up is under way
        db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
        await db.open()
        try:
            # The ghost gives its claims back after its shards moved here (a due notice each).
            await JobStore(db, node_id="ghost", lease_s=600).release(
                [uuid.UUID(job_id) for job_id in released], announce=True
            )
        finally:
            await db.close()
        missing = await collector.wait_for([*expiring, *released, *backlog], 90)
    assert missing == set()
    arrived = {
        job_id: deliveries[0].received_at for job_id, deliveries in collector.deliveries.items()
    }
    last_recovered = max(arrived[job_id] for job_id in (*expiring, *released))
    backlog_by_then = sum(1 for job_id in backlog if arrived[job_id] <= last_recovered)
    assert backlog_by_then < len(backlog) / 2, (backlog_by_then, len(backlog))


class CountingStore(JobStore):
    """The real store, counting how often a sweep looks for a previous owner's claims and for
    stragglers, and from when it looks for expired leases."""

    orphan_looks = 0
    straggler_looks = 0
    straggler_slowness_s = 0.0  # added to each straggler look: what a held snapshot does
    lease_looks_since: tuple[datetime, ...] = ()

    async def expired_leases(
        self, shards: Sequence[int], limit: int, *, since: datetime = EVER
    ) -> tuple[list[models.DueEntry], datetime]:
        self.lease_looks_since += (since,)
        return await super().expired_leases(shards, limit, since=since)

    async def orphaned_claims(
        self, epochs: Mapping[int, int], limit: int, *, handover: models.Handover
    ) -> models.Orphans:
        self.orphan_looks += 1
        return await super().orphaned_claims(epochs, limit, handover=handover)

    async def overdue_stragglers(
        self,
        shards: Sequence[int],
        grace_s: float,
        limit: int,
        *,
        held: HeldKeys = NOTHING_HELD,
    ) -> list[models.DueEntry]:
        self.straggler_looks += 1
        await asyncio.sleep(self.straggler_slowness_s)
        return await super().overdue_stragglers(shards, grace_s, limit, held=held)


async def sweeping(
    db: Database, store: JobStore, due_lanes: lanes.Lanes
) -> tuple[Loader, dict[int, int]]:
    """A loader over the real store that took every shard (the epochs it took them under)."""
    await ShardStore(db).ensure(SHARDS)
    epochs = await ShardStore(db).bump(list(range(SHARDS)), "sweeper")
    loader = Loader(
        store,
        due_lanes,
        window=WindowLimits(lookahead_s=60, heap_cap=1000, load_batch=100),
        sweeps=SweepTimes(every_s=5, grace_s=15),
        now=time.time,
    )
    loader.gain(epochs)
    return loader, epochs


async def test_a_previous_owners_claims_are_looked_for_after_each_takeover_until_all_are_found(
    database_url: str,
) -> None:
    """The look reads every in-flight entry (a held snapshot keeps them all): only a takeover
    makes such claims, so the sweeps look until one found them all, then not until the next."""
    [orphan, *_] = await insert_overdue(database_url, 2, SHARDS, spacing_ms=10, routing_key=KEY)
    await claim_as_ghost(database_url, [orphan], lease_s=600.0)
    db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await db.open()
    try:
        async with db.connection() as connection:  # claimed under the epoch before any taken here
            await connection.execute("UPDATE jobs SET claim_epoch = 0 WHERE id = $1", orphan)
        store = CountingStore(db, node_id="sweeper", lease_s=30)
        due_lanes = lanes.Lanes(catchup_share=0.25, pace=pacing.Pace(0, batch=50))
        loader, epochs = await sweeping(db, store, due_lanes)
        assert await loader.sweep() == 1  # the ghost's claim
        assert due_lanes.recovery_count == 1
        looks = store.orphan_looks
        await loader.sweep()
        await loader.sweep()
        assert store.orphan_looks == looks  # all found: no more looks until a takeover
        loader.gain({0: epochs[0] + 1})
        await loader.sweep()
        assert store.orphan_looks == looks + 1
    finally:
        await db.close()


async def test_a_slow_straggler_look_spaces_out_the_next_ones(database_url: str) -> None:
    """The straggler look walks jobs_due from its start, through every dead entry a held
    snapshot keeps: however slow it gets, it takes at most 1/FULL_LOOK_SPACING of the time."""
    db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await db.open()
    try:
        store = CountingStore(db, node_id="sweeper", lease_s=30)
        loader, _ = await sweeping(
            db, store, lanes.Lanes(catchup_share=0.25, pace=pacing.Pace(0, batch=50))
        )
        await loader.fill()  # the backlog found empty: stragglers are the sweep's to look for
        await loader.fill()
        await loader.sweep()
        assert store.straggler_looks == 1
        await asyncio.sleep(1.0)  # past the spacing of a look of a few milliseconds
        store.straggler_slowness_s = 0.05
        looked = time.monotonic()
        await loader.sweep()
        assert store.straggler_looks == 2
        # A sweep every 100 ms (as shards taken would bring): the next look comes only once the
        # spacing of a look of 50 ms and more has passed (the query's own time adds to it).
        while store.straggler_looks == 2 and time.monotonic() - looked < 30:
            await asyncio.sleep(0.1)
            await loader.sweep()
        spaced_s = time.monotonic() - looked
        assert 0.05 * FULL_LOOK_SPACING <= spaced_s < 30
    finally:
        await db.close()


async def test_the_lease_look_starts_where_the_last_complete_one_did_with_full_looks_as_the_net(
    database_url: str, db: Database
) -> None:
    """Between full looks (after each takeover, then spaced by their cost) a sweep reads only the
    leases run out since the last complete look: one run out since is found; one that ran out
    long before (a claim slower than its lease) is left to the next full look."""
    soon, slow = await insert_overdue(database_url, 2, SHARDS, spacing_ms=10, routing_key=KEY)
    store = CountingStore(db, node_id="sweeper", lease_s=30)
    loader, epochs = await sweeping(
        db, store, lanes.Lanes(catchup_share=0.25, pace=pacing.Pace(0, batch=50))
    )
    assert await loader.sweep() == 0
    assert store.lease_looks_since == (EVER,)  # the first look over shards just taken
    loader._full_lease_look_after = time.monotonic() + 3600  # not due again in this test
    await claim_as_ghost(database_url, [soon], lease_s=0.2)
    await asyncio.sleep(0.5)
    assert await loader.sweep() == 1  # its lease ran out after the last look: found
    first_mark = store.lease_looks_since[-1]
    assert first_mark > EVER
    async with db.connection() as connection:
        await connection.execute(CLAIM_BY_HAND, [uuid.UUID(slow)], "ghost", -3600.0, None, None)
    assert await loader.sweep() == 0  # before the mark: not read
    assert store.lease_looks_since[-1] > first_mark
    loader._full_lease_look_after = 0.0  # the full look's spacing has passed
    assert await loader.sweep() == 1  # the net finds it
    assert store.lease_looks_since[-1] == EVER
    loader._full_lease_look_after = time.monotonic() + 3600
    await loader.sweep()
    assert store.lease_looks_since[-1] > EVER
    loader.gain({0: epochs[0] + 1})  # a shard taken: its leases were never looked at here
    await loader.sweep()
    assert store.lease_looks_since[-1] == EVER


async def claim_as(db: Database, job_id: str, node: str, *, shard: int, epoch: int) -> None:
    """A claim ``node`` made of the job on ``shard`` under ``epoch``, with a 30 s lease."""
    async with db.connection() as connection:
        await connection.execute(CLAIM_BY_HAND, [uuid.UUID(job_id)], node, 30.0, epoch, shard)


async def test_a_live_previous_owners_claims_wait_for_it_to_settle_them_a_dead_ones_fire_at_once(
    database_url: str, db: Database
) -> None:
    """A node that lost a shard may have published a claim and be about to mark it: the new
    owner fires it again only once the old owner had the handover's time to settle it (one it
    marked meanwhile is never fired again); a dead owner's claims fire at once. This process's
    own claims under an earlier epoch it held are a live owner's; those its node id made before
    this process first took the shard are a dead process's."""
    jobs = list(await insert_overdue(database_url, 5, SHARDS, spacing_ms=10, routing_key=KEY))
    dead_nodes, dead_process, live_node, live_marked, live_self = jobs
    store = CountingStore(db, node_id="sweeper", lease_s=30)
    due_lanes = lanes.Lanes(catchup_share=0.25, pace=pacing.Pace(0, batch=50))
    await ShardStore(db).ensure(SHARDS)
    first = await ShardStore(db).bump([0], "sweeper")
    members = frozenset({"sweeper", "alive"})
    loader = Loader(
        store,
        due_lanes,
        window=WindowLimits(lookahead_s=60, heap_cap=1000, load_batch=100),
        sweeps=SweepTimes(every_s=5, grace_s=15, handover_s=1.5),
        now=time.time,
        members=lambda: members,
    )
    loader.gain(first)
    taken = first[0] + 1
    await claim_as(db, dead_nodes, "gone", shard=0, epoch=first[0])
    await claim_as(db, dead_process, "sweeper", shard=0, epoch=first[0] - 1)
    await claim_as(db, live_node, "alive", shard=0, epoch=first[0])
    await claim_as(db, live_marked, "alive", shard=0, epoch=first[0])
    await claim_as(db, live_self, "sweeper", shard=0, epoch=first[0])
    async with db.connection() as connection:  # shard 0 taken again: the claims are of the past
        await connection.execute("UPDATE shard_epochs SET epoch = $1 WHERE shard = 0", taken)
    loader.gain({0: taken})
    assert await loader.sweep() == 2
    recovered = {str(entry.id) for entry in due_lanes.take(time.time(), 50, live_only=False)}
    assert recovered == {dead_nodes, dead_process}
    async with db.connection() as connection:  # fired again here (what the firer does with them)
        await connection.execute(
            "UPDATE jobs SET state = 'dispatched' WHERE id = ANY($1::uuid[])", list(recovered)
        )
    await JobStore(db, node_id="alive", lease_s=30).mark_dispatched([uuid.UUID(live_marked)])
    assert await loader.sweep() == 0  # not yet ripe
    await asyncio.sleep(1.6)
    assert await loader.sweep() == 2
    recovered = {str(entry.id) for entry in due_lanes.take(time.time(), 50, live_only=False)}
    assert recovered == {live_node, live_self}
    looks = store.orphan_looks
    await loader.sweep()
    assert store.orphan_looks == looks  # all found and ripe: the looking ended
