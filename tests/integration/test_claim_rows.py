"""Claims as rows (sql/0030): each claim statement inserts one row naming its jobs, their shards
and epochs, the node and the lease; the look for run-out leases finds a job through its claim,
once, while it is still in flight under it; housekeeping deletes the claims with nothing in
flight under them and keeps the others; the migration gives the jobs in flight before it their
claims. Real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from dispatcher.store import migrate
from dispatcher.store.db import Database
from dispatcher.store.history import HistoryStore
from dispatcher.store.jobs import JobStore
from dispatcher.store.shards import ShardStore
from tests.integration.test_store import due, new_job
from tests.support import migrated

NODE = "claims-node"


@pytest.fixture
async def store(db: Database) -> JobStore:
    await ShardStore(db).ensure(4)
    return JobStore(db, node_id=NODE, lease_s=30)


async def claim_rows(database_url: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(
            "SELECT c.node, c.ids, c.shards, c.epochs, c.lease_until,"
            " (SELECT array_agg(DISTINCT j.lease_until) FROM jobs j WHERE j.id = ANY (c.ids))"
            " AS job_leases FROM claims c ORDER BY c.id"
        )
    finally:
        await connection.close()


async def test_a_claim_is_one_row_naming_its_jobs_shards_epochs_node_and_lease(
    store: JobStore, db: Database, database_url: str
) -> None:
    jobs = [new_job(shard=1), new_job(shard=2), new_job(shard=1)]
    await store.insert(jobs)
    epochs = await ShardStore(db).bump([1, 2], NODE)
    claim = await store.claim(due(*jobs), epochs)
    assert {job.id for job in claim.jobs} == {job.id for job in jobs}
    [row] = await claim_rows(database_url)
    assert row["node"] == NODE
    by_id = dict(zip(row["ids"], zip(row["shards"], row["epochs"], strict=True), strict=True))
    assert by_id == {job.id: (job.shard, epochs[job.shard]) for job in jobs}
    assert row["job_leases"] == [row["lease_until"]]  # the rows' lease is the claim's

    nothing = await store.claim(due(*jobs), epochs)  # in flight already: nothing claimed
    assert nothing.jobs == []
    assert len(await claim_rows(database_url)) == 1  # and no row for it


async def test_a_run_out_lease_is_found_through_its_claim_while_in_flight_under_it(
    db: Database, database_url: str
) -> None:
    await ShardStore(db).ensure(4)
    store = JobStore(db, node_id=NODE, lease_s=0.2)
    confirmed, lost = new_job(shard=0), new_job(shard=0)
    await store.insert([confirmed, lost])
    epochs = await ShardStore(db).bump([0], NODE)
    await store.claim(due(confirmed, lost), epochs)
    await store.mark_dispatched([confirmed.id])
    await asyncio.sleep(0.4)
    expired, _ = await store.expired_leases([0], 100)
    assert [entry.id for entry in expired] == [lost.id]  # the confirmed one is not in flight
    again = await store.claim(expired, epochs)  # fired again: a claim of its own
    assert [job.id for job in again.jobs] == [lost.id]
    await asyncio.sleep(0.4)
    expired, _ = await store.expired_leases([0], 100)
    assert [entry.id for entry in expired] == [lost.id]  # once, by its latest claim
    assert len(await claim_rows(database_url)) == 2


async def test_housekeeping_deletes_the_claims_with_nothing_in_flight_and_keeps_the_others(
    store: JobStore, db: Database, database_url: str
) -> None:
    marked, released, kept = new_job(shard=0), new_job(shard=0), new_job(shard=3)
    await store.insert([marked, released, kept])
    epochs = await ShardStore(db).bump([0, 3], NODE)
    for job in (marked, released, kept):  # a claim each
        await store.claim(due(job), epochs)
    await store.mark_dispatched([marked.id])
    await store.release([released.id])
    history = HistoryStore(db)
    # Made just now: not looked at yet, whatever they hold.
    assert await history.delete_spent_claims(older_than_s=5, batch=10) == 0
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("UPDATE claims SET made_at = now() - interval '10 s'")
    finally:
        await connection.close()
    assert await history.delete_spent_claims(older_than_s=5, batch=10) == 2
    [row] = await claim_rows(database_url)
    assert row["ids"] == [kept.id]
    await store.mark_dispatched([kept.id])
    assert await history.delete_spent_claims(older_than_s=5, batch=10) == 1
    assert await claim_rows(database_url) == []


async def test_the_migration_gives_the_jobs_in_flight_before_it_their_claims(
    empty_database_url: str,
) -> None:
    in_flight = {
        uuid.UUID(int=1): ("n1", 30.0, 4),
        uuid.UUID(int=2): ("n1", 30.0, 4),  # the same claim as 1
        uuid.UUID(int=3): ("n1", 31.0, 4),  # the same node, a later claim
        uuid.UUID(int=4): ("n2", 30.0, 7),
    }

    async def fill(connection: asyncpg.Connection) -> None:
        # One statement: one now(), so the jobs of one claim share its lease end.
        await connection.execute(
            "INSERT INTO jobs (id, shard, routing_key, payload, run_at, state, lease_until,"
            " claim_epoch, claimed_by)"
            " SELECT id, (get_byte(uuid_send(id), 15) % 2), 'a.b', '1'::bytea, now(),"
            " 'dispatching', now() + make_interval(secs => lease_s), epoch, node"
            " FROM unnest($1::uuid[], $2::text[], $3::float8[], $4::bigint[])"
            " AS j(id, node, lease_s, epoch)",
            list(in_flight),
            [node for node, _, _ in in_flight.values()],
            [lease_s for _, lease_s, _ in in_flight.values()],
            [epoch for _, _, epoch in in_flight.values()],
        )
        await connection.execute(
            "INSERT INTO jobs (id, shard, routing_key, payload, run_at)"
            " VALUES ($1, 0, 'a.b', '1'::bytea, now())",
            uuid.UUID(int=5),  # scheduled: in no claim
        )

    await migrated.migrate_before(empty_database_url, "0030", table="jobs", fill=fill)
    await migrate.apply_migrations(empty_database_url)
    rows = await claim_rows(empty_database_url)
    claims = sorted(
        (row["node"], sorted(row["ids"]), list(row["shards"]), list(row["epochs"])) for row in rows
    )
    assert claims == [
        ("n1", [uuid.UUID(int=1), uuid.UUID(int=2)], [1, 0], [4, 4]),
        ("n1", [uuid.UUID(int=3)], [1], [4]),
        ("n2", [uuid.UUID(int=4)], [0], [7]),
    ]
    for row in rows:
        assert row["job_leases"] == [row["lease_until"]]
