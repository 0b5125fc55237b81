"""Migration 0028: the jobs an earlier release left dispatching with their consumer's outcome
waiting in ``jobs.reported`` for the confirm's mark are settled as that mark would have; the
others are left as they are."""

from __future__ import annotations

import uuid

import asyncpg

from dispatcher.store import migrate
from tests.support import migrated

# $1 id, $2 state, $3 reported, $4 reported_error.
STORE = """
INSERT INTO jobs (id, shard, routing_key, payload, run_at, state, lease_until, claim_epoch,
                  claimed_by, reported, reported_error)
VALUES ($1, 0, 'a.b', '1'::bytea, now(), $2,
        CASE WHEN $2 = 'dispatching' THEN now() + interval '30 s' END,
        CASE WHEN $2 = 'dispatching' THEN 1 END,
        CASE WHEN $2 = 'dispatching' THEN 'n1' END, $3, $4)
"""
ROWS = {
    uuid.UUID(int=1): ("dispatching", "succeeded", None),
    uuid.UUID(int=2): ("dispatching", "dead", "Reject: no such order"),
    uuid.UUID(int=3): ("dispatching", None, None),  # no outcome yet: its mark will come
    uuid.UUID(int=4): ("scheduled", None, None),
}


async def fill(connection: asyncpg.Connection) -> None:
    for job_id, (state, reported, error) in ROWS.items():
        await connection.execute(STORE, job_id, state, reported, error)


async def test_jobs_left_with_an_outcome_waiting_for_their_mark_are_settled(
    empty_database_url: str,
) -> None:
    await migrated.migrate_before(empty_database_url, "0028", table="jobs", fill=fill)
    await migrate.apply_migrations(empty_database_url)
    connection = await asyncpg.connect(empty_database_url)
    try:
        rows = {
            row["id"]: row
            for row in await connection.fetch(
                "SELECT id, state, last_error, lease_until IS NULL AS unleased,"
                " dispatched_at IS NOT NULL AS dispatched, reported, reported_error FROM jobs"
            )
        }
    finally:
        await connection.close()
    settled = {job_id: (row["state"], row["last_error"]) for job_id, row in rows.items()}
    assert settled == {
        uuid.UUID(int=1): ("succeeded", None),
        uuid.UUID(int=2): ("dead", "Reject: no such order"),
        uuid.UUID(int=3): ("dispatching", None),
        uuid.UUID(int=4): ("scheduled", None),
    }
    for job_id in (uuid.UUID(int=1), uuid.UUID(int=2)):
        assert rows[job_id]["unleased"]
        assert rows[job_id]["dispatched"]
        assert (rows[job_id]["reported"], rows[job_id]["reported_error"]) == (None, None)
    assert not rows[uuid.UUID(int=3)]["unleased"]
