"""Job dependencies against a real PostgreSQL, for the store tests: the stores over one database,
jobs submitted as the intake would, and consumers' events recorded as the events consumer does."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from consumers_sdk import contract, ids
from dispatcher import models
from dispatcher.store.db import Database
from dispatcher.store.history import HistoryStore
from dispatcher.store.jobs import JobStore

IDS = ids.JobIds()


@dataclass
class Stores:
    db: Database
    jobs: JobStore
    history: HistoryStore
    sql: asyncpg.Connection

    async def submit(
        self,
        *after: uuid.UUID,
        key: str | None = None,
        namespace: str | None = None,
        run_at: datetime | None = None,
    ) -> models.Job:
        [result] = await self.jobs.insert(
            [new_job(after=after, key=key, namespace=namespace, run_at=run_at)]
        )
        return result.job

    async def dispatched(self, *ids: uuid.UUID) -> None:
        """As the firing path leaves a job once RabbitMQ confirmed it."""
        await self.sql.execute(
            "UPDATE jobs SET state = 'dispatched' WHERE id = ANY($1::uuid[])", list(ids)
        )

    async def report(self, job_id: uuid.UUID, outcome: str, event_id: str | None = None) -> None:
        """A consumer's final event about the job's current dispatch, recorded as the events
        consumer does."""
        await self.history.record([event(job_id, outcome, event_id, await self.round_of(job_id))])

    async def round_of(self, job_id: uuid.UUID) -> str:
        """The job's dispatch round, as its consumers echo it (on a pooled connection: reports
        may run at once)."""
        async with self.db.connection() as connection:
            found = await connection.fetchval(
                "SELECT dispatch_round FROM jobs WHERE id = $1", job_id
            )
        return str(found)

    async def state(self, job_id: uuid.UUID) -> tuple[str, str | None]:
        row = await self.sql.fetchrow("SELECT state, last_error FROM jobs WHERE id = $1", job_id)
        assert row is not None
        return row["state"], row["last_error"]

    async def states(self, *ids: uuid.UUID) -> list[str]:
        return [(await self.state(job_id))[0] for job_id in ids]


def new_job(
    *,
    after: Sequence[uuid.UUID] = (),
    key: str | None = None,
    namespace: str | None = None,
    run_at: datetime | None = None,
    job_id: uuid.UUID | None = None,
) -> models.NewJob:
    spec = models.JobSpec(
        routing_key="orders.expire",
        payload=b"{}",
        run_at=run_at or datetime.now(UTC),
        idempotency_key=key,
        headers={},
        after=tuple(after),
    )
    return models.NewJob(id=job_id or IDS.next(), shard=0, spec=spec, namespace=namespace)


def event(
    job_id: uuid.UUID, outcome: str, event_id: str | None = None, dispatch_round: str | None = None
) -> contract.JobEvent:
    return contract.JobEvent(
        event_id=event_id or str(uuid.uuid4()),
        job_id=str(job_id),
        routing_key="orders.expire",
        group="billing",
        consumer="w1",
        attempt=1,
        outcome=outcome,
        error="ValueError: no" if outcome == "dead" else None,
        at=datetime.now(UTC),
        dispatch_round=dispatch_round,
    )


@asynccontextmanager
async def open_stores(database_url: str) -> AsyncIterator[Stores]:
    db = Database(database_url, min_size=1, max_size=6, timeout_s=10)
    await db.open()
    connection = await asyncpg.connect(database_url)
    try:
        yield Stores(db, JobStore(db, node_id="n1", lease_s=30), HistoryStore(db), connection)
    finally:
        await connection.close()
        await db.close()
