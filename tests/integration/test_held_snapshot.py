"""While a snapshot is held (a report, a pg_dump, a forgotten BEGIN), vacuum removes nothing that
died after it began: every job fired since leaves a dead entry in the lease index. The sweeps'
look at expired leases reads, by ``EXPLAIN (ANALYZE, BUFFERS)``, what the last round of firing
left (a count of buffers that stays put as rounds pile up), where a look at every lease run out
reads them all; that full look is the one spaced by its cost (``FULL_LOOK_SPACING``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import asyncpg
import pytest

from consumers_sdk import ids
from dispatcher import models
from dispatcher.firing import lanes, loader, pacing
from dispatcher.firing.loader import Loader, SweepTimes, WindowLimits
from dispatcher.store.db import Database
from dispatcher.store.jobs import EVER, JobStore
from dispatcher.store.queries import scheduler as queries
from dispatcher.store.shards import ShardStore

SHARDS = 8
ROUNDS = 5
FIRED_A_ROUND = 1000
LEASE_S = 0.05  # every lease of a round has run out by the sweep that follows it
IDS = ids.JobIds()


class LeaseLooks(JobStore):
    """The real store, keeping the lower bound of each look at expired leases."""

    since: list[datetime]

    async def expired_leases(
        self, shards: Sequence[int], limit: int, *, since: datetime = EVER
    ) -> tuple[list[models.DueEntry], datetime]:
        self.since.append(since)
        return await super().expired_leases(shards, limit, since=since)


@pytest.fixture
async def held_snapshot(database_url: str) -> AsyncIterator[None]:
    """A session holding a repeatable-read snapshot, as a long report would."""
    holder = await asyncpg.connect(database_url)
    transaction = holder.transaction(isolation="repeatable_read")
    await transaction.start()
    await holder.fetchval("SELECT count(*) FROM jobs")
    yield
    await transaction.rollback()
    await holder.close()


async def fire_a_round(store: JobStore, epochs: dict[int, int]) -> None:
    """Jobs stored, claimed and confirmed as firing does: each leaves a dead lease entry."""
    now = datetime.now(UTC)
    jobs = [
        models.NewJob(
            id=IDS.next(),
            shard=i % SHARDS,
            spec=models.JobSpec(routing_key="held.work", payload=b"1", run_at=now, headers={}),
        )
        for i in range(FIRED_A_ROUND)
    ]
    await store.insert(jobs)
    entries = [models.DueEntry.make(now.timestamp(), job.id, job.shard) for job in jobs]
    claim = await store.claim(entries, epochs)
    assert len(claim.jobs) == FIRED_A_ROUND
    await store.mark_dispatched(job.id for job in claim.jobs)


async def buffers_read(database_url: str, since: datetime) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        explained = await connection.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {queries.EXPIRED_LEASES}",
            list(range(SHARDS)),
            100,
            since,
        )
    finally:
        await connection.close()
    plan = json.loads(explained)[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


async def test_the_lease_look_reads_what_the_last_round_left_however_many_came_before(
    database_url: str, db: Database, held_snapshot: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rounds a second apart, the look reaching half a second before the last complete one.
    monkeypatch.setattr(loader, "LEASE_LOOK_BACK_S", 0.5)
    store = LeaseLooks(db, node_id="firer", lease_s=LEASE_S)
    store.since = []
    await ShardStore(db).ensure(SHARDS)
    epochs = await ShardStore(db).bump(list(range(SHARDS)), "firer")
    sweeper = Loader(
        store,
        lanes.Lanes(catchup_share=0.25, pace=pacing.Pace(0, batch=50)),
        window=WindowLimits(lookahead_s=60, heap_cap=1000, load_batch=100),
        sweeps=SweepTimes(every_s=5, grace_s=15),
        now=time.time,
    )
    sweeper.gain(epochs)
    windowed: list[int] = []
    full: list[int] = []
    for _ in range(ROUNDS):
        started = time.monotonic()
        await fire_a_round(store, epochs)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        # Spaced by its cost, the full look is not due again within the test.
        monkeypatch.setattr(sweeper, "_full_lease_look_after", time.monotonic() + 3600)
        assert await sweeper.sweep() == 0  # every claim was confirmed: none to re-fire
        windowed.append(await buffers_read(database_url, store.since[-1]))
        full.append(await buffers_read(database_url, EVER))
    # The first look after taking the shards is a full one; each after starts from the last.
    assert store.since[0] == EVER
    assert all(a < b for a, b in zip(store.since[1:], store.since[2:], strict=False)), store.since
    # The dead entries pile up (what a full look reads grows with every round)...
    assert full[-1] >= 3 * full[0], full
    # ...while the windowed look reads what a round or two left (a look that came late reads the
    # round before too), not what every round left.
    assert max(windowed[1:]) <= 2 * min(windowed[1:]) + 10, windowed
    assert max(windowed[1:]) * 2 < full[-1], (windowed, full)
