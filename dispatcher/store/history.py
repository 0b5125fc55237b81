"""HistoryStore: consumers' events, the retention of finished jobs, and the statistics the
console and ``/metrics`` show. Each call is one round trip."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from consumers_sdk import contract
from dispatcher import errors, models
from dispatcher.store import queries
from dispatcher.store.db import Database

# Background statements may run longer than an API request is allowed to wait.
BACKGROUND_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Count:
    state: str
    routing_key: str
    jobs: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Due:
    id: uuid.UUID
    routing_key: str
    run_at: datetime


class HistoryStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(self, events: Sequence[contract.JobEvent]) -> list[contract.JobEvent]:
        """Record events (each event id once; events of unknown jobs are dropped) and move their
        jobs to the final state they report; returns the events newly recorded."""
        if not events:
            return []
        async with self._db.connection(BACKGROUND_TIMEOUT_S) as connection:
            try:
                rows = await self._record(connection, events)
            except asyncpg.DataError as exc:
                raise errors.InvalidEvent(str(exc)) from exc
        new = {str(row["event_id"]) for row in rows}
        return [event for event in events if event.event_id in new]

    async def _record(
        self, connection: asyncpg.pool.PoolConnectionProxy, events: Sequence[contract.JobEvent]
    ) -> list[asyncpg.Record]:
        return await connection.fetch(
            queries.RECORD_EVENTS,
            [uuid.UUID(e.event_id) for e in events],
            [uuid.UUID(e.job_id) for e in events],
            [e.outcome for e in events],
            [e.attempt for e in events],
            [e.group for e in events],
            [e.consumer for e in events],
            [e.error for e in events],
            [e.at for e in events],
        )

    async def events(self, job_id: uuid.UUID) -> list[models.JobEvent]:
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.SELECT_JOB_EVENTS, job_id)
        return [
            models.JobEvent(
                outcome=row["outcome"],
                attempt=row["attempt"],
                group=row["consumer_group"],
                consumer=row["consumer"],
                error=row["error"],
                at=row["at"],
            )
            for row in rows
        ]

    async def delete_finished(self, *, older_than_s: float, batch: int) -> int:
        """Delete one batch of jobs finished before the retention, with their events."""
        async with self._db.connection(BACKGROUND_TIMEOUT_S) as connection:
            rows = await connection.fetch(queries.DELETE_FINISHED, older_than_s, batch)
        return len(rows)

    async def counts(self) -> list[Count]:
        async with self._db.connection(BACKGROUND_TIMEOUT_S) as connection:
            rows = await connection.fetch(queries.COUNT_BY_STATE)
        return [
            Count(state=row["state"], routing_key=row["routing_key"], jobs=row["jobs"])
            for row in rows
        ]

    async def next_due(self, limit: int) -> list[Due]:
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.NEXT_DUE, limit)
        return [
            Due(id=row["id"], routing_key=row["routing_key"], run_at=row["run_at"]) for row in rows
        ]
