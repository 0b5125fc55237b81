"""Jobs put straight into a state for the tests of consumer events, the events those tests send,
and what the database then says of the jobs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg

from consumers_sdk import contract

ROUTING_KEY = "billing.charge"


async def insert_dispatched(
    database_url: str,
    *,
    state: str = "dispatched",
    with_round: bool = True,
    routing_key: str = ROUTING_KEY,
    namespace: str | None = None,
) -> tuple[uuid.UUID, uuid.UUID | None]:
    """A job in ``state`` with its round (None: stored and dispatched before migration 0011);
    returns (id, round)."""
    job_id = uuid.uuid4()
    connection = await asyncpg.connect(database_url)
    try:
        dispatch_round: uuid.UUID | None = await connection.fetchval(
            "INSERT INTO jobs (id, shard, state, routing_key, payload, run_at, dispatched_at, "
            "dispatch_round, namespace) VALUES ($1, 0, $2, $3, '{}', now(), now(), "
            "CASE WHEN $4 THEN gen_random_uuid() END, $5) RETURNING dispatch_round",
            job_id,
            state,
            routing_key,
            with_round,
            namespace,
        )
    finally:
        await connection.close()
    return job_id, dispatch_round


async def state_of(database_url: str, job_id: uuid.UUID | str) -> tuple[str, str | None]:
    """(state, last_error) of a job."""
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow(
            "SELECT state, last_error FROM jobs WHERE id = $1", uuid.UUID(str(job_id))
        )
    finally:
        await connection.close()
    assert row is not None
    return row["state"], row["last_error"]


async def dispatch_round(database_url: str, job_id: uuid.UUID | str) -> uuid.UUID | None:
    connection = await asyncpg.connect(database_url)
    try:
        found: uuid.UUID | None = await connection.fetchval(
            "SELECT dispatch_round FROM jobs WHERE id = $1", uuid.UUID(str(job_id))
        )
    finally:
        await connection.close()
    return found


def event(
    job_id: uuid.UUID | str,
    outcome: str,
    *,
    dispatch_round: uuid.UUID | str | None,
    routing_key: str = ROUTING_KEY,
    error: str | None = None,
    at: datetime | None = None,
) -> contract.JobEvent:
    """An event as a consumer of group ``billing`` would report it, now (or dated ``at``)."""
    return contract.JobEvent(
        event_id=str(uuid.uuid4()),
        job_id=str(job_id),
        routing_key=routing_key,
        group="billing",
        consumer="worker-1",
        attempt=1,
        outcome=outcome,
        error=error,
        at=at or datetime.now(UTC),
        dispatch_round=None if dispatch_round is None else str(dispatch_round),
    )
