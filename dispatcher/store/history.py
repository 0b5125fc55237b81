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
from dispatcher.amqp import event_users
from dispatcher.store.db import Database
from dispatcher.store.queries import history as queries

# Background statements may run longer than an API request is allowed to wait.
BACKGROUND_TIMEOUT_S = 30.0
# Counting a state of hundreds of millions of jobs takes minutes (it is then done rarely).
COUNT_TIMEOUT_S = 600.0
# Ignored events kept in a job's history; the others are only counted (``jobs.ignored_dropped``).
IGNORED_KEPT = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class StateCount:
    """One state's last count: its top routing keys (most jobs first) and the rest summed."""

    state: str
    by_key: dict[str, int]
    other_jobs: int
    counted_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Due:
    id: uuid.UUID
    routing_key: str
    run_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class DueGroup:
    """The jobs of one routing key due in one minute."""

    minute: datetime
    routing_key: str
    jobs: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Recorded:
    """An event newly recorded: counted, or kept in the history with why it was ignored."""

    event: contract.JobEvent
    # no_user, publisher, other_round, no_round, routing_key (see ``queries.RECORD_EVENTS``)
    ignored: str | None


class HistoryStore:
    """``grants`` (``DISPATCHER_EVENT_USERS``): who may report on which jobs; empty: anyone."""

    def __init__(self, db: Database, grants: Sequence[event_users.Grant] = ()) -> None:
        self._db = db
        self._grants = event_users.columns(grants)

    async def record(
        self,
        events: Sequence[contract.JobEvent],
        publishers: Sequence[str | None] | None = None,
    ) -> list[Recorded]:
        """Record events (each event id once; events of unknown jobs are dropped) and move their
        jobs to the final state they report, unless ignored (a publisher without a grant for the
        job, another dispatch round, none, or another routing key); returns the events newly
        recorded (or, past ``IGNORED_KEPT`` ignored ones a job, counted). ``publishers``: the
        broker user that published each event (its message's ``user_id``), None when unknown."""
        if not events:
            return []
        if publishers is None:
            publishers = [None] * len(events)
        async with self._db.connection(BACKGROUND_TIMEOUT_S) as connection:
            try:
                rows = await self._record(connection, events, publishers)
            except asyncpg.DataError as exc:
                raise errors.InvalidEvent(str(exc)) from exc
        new = {str(row["event_id"]): row["ignored"] for row in rows}
        return [
            Recorded(event=event, ignored=new[event.event_id])
            for event in events
            if event.event_id in new
        ]

    async def _record(
        self,
        connection: asyncpg.pool.PoolConnectionProxy,
        events: Sequence[contract.JobEvent],
        publishers: Sequence[str | None],
    ) -> list[asyncpg.Record]:
        users, namespaces, prefixes = self._grants
        return await connection.fetch(
            queries.RECORD_EVENTS,
            # Ids as the canonical text decoding checked: asyncpg reads it as uuid in C.
            [e.event_id for e in events],
            [e.job_id for e in events],
            [e.outcome for e in events],
            [e.attempt for e in events],
            [e.group for e in events],
            [e.consumer for e in events],
            [e.error for e in events],
            [e.at for e in events],
            [e.routing_key for e in events],
            [e.dispatch_round for e in events],
            list(publishers),
            users,
            namespaces,
            prefixes,
            IGNORED_KEPT,
        )

    async def history(self, job_id: uuid.UUID, *, limit: int = 2**31 - 1) -> models.JobHistory:
        """The job's events in the order they happened, at most ``limit`` reported ones (the
        newest; the dispatcher's own steps always), and its ignored events not kept."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.SELECT_JOB_EVENTS, job_id, limit)
        return models.JobHistory(
            events=tuple(
                models.JobEvent(
                    outcome=row["outcome"],
                    attempt=row["attempt"],
                    group=row["consumer_group"],
                    consumer=row["consumer"],
                    error=row["error"],
                    at=row["at"],
                    ignored=row["ignored"],
                    detail=row["detail"],
                )
                for row in rows
            ),
            ignored_dropped=(rows[0]["ignored_dropped"] or 0) if rows else 0,
            events_omitted=max((rows[0]["reported"] if rows else 0) - limit, 0),
        )

    async def events(self, job_id: uuid.UUID) -> list[models.JobEvent]:
        return list((await self.history(job_id)).events)

    async def delete_finished(
        self, *, older_than_s: float, batch: int, after: uuid.UUID
    ) -> tuple[uuid.UUID | None, int]:
        """Delete the jobs finished before the retention among the next ``batch`` after id
        ``after`` (their events go with their batches: ``delete_spent_batches``); returns the
        last id looked at (None: no job after ``after`` was made that long ago) and how many
        went."""
        async with self._db.connection(BACKGROUND_TIMEOUT_S) as connection:
            row = await connection.fetchrow(queries.DELETE_FINISHED, older_than_s, batch, after)
        assert row is not None  # one row: two scalar subqueries
        return row["last"], row["deleted"]

    async def delete_spent_batches(
        self, *, older_than_s: float, batch: int, after: int
    ) -> tuple[int | None, int]:
        """Delete the event batches among the next ``batch`` after id ``after`` recorded before
        the retention whose jobs are all gone; returns the last id looked at (None: no batch
        after ``after`` is that old) and how many went."""
        async with self._db.connection(BACKGROUND_TIMEOUT_S) as connection:
            row = await connection.fetchrow(
                queries.DELETE_SPENT_BATCHES, older_than_s, batch, after
            )
        assert row is not None  # one row: two scalar subqueries
        return row["last"], row["deleted"]

    async def delete_spent_claims(self, *, older_than_s: float, batch: int) -> int:
        """Delete up to ``batch`` claims made before ``older_than_s`` ago with nothing in flight
        under them any more; returns how many went."""
        async with self._db.connection(BACKGROUND_TIMEOUT_S) as connection:
            deleted: int = await connection.fetchval(
                queries.DELETE_SPENT_CLAIMS, older_than_s, batch
            )
        return deleted

    async def recount(
        self, states: Sequence[str], *, min_age_s: float, spacing: float, top: int
    ) -> list[str]:
        """Count the states last counted longer ago than both ``min_age_s`` and ``spacing`` times
        what their count took, unless another node is counting; returns the states counted.

        Read-only until the counts are saved together at the end, so the transaction holds no
        transaction id (which would hold back vacuum) while it scans."""
        async with (
            self._db.connection(COUNT_TIMEOUT_S) as connection,
            connection.transaction(),
        ):
            if not await connection.fetchval(queries.TRY_COUNT_LOCK):
                return []
            due = await connection.fetch(queries.STATES_TO_COUNT, list(states), min_age_s, spacing)
            counted: list[asyncpg.Record] = []
            unindexed: list[str] = []  # counted together: one read of the table for them all
            for row in due:
                if row["state"] in queries.INDEXED_STATES:
                    counted += await connection.fetch(queries.COUNT_STATE, row["state"], top)
                else:
                    unindexed.append(row["state"])
            if unindexed:
                counted += await connection.fetch(queries.COUNT_UNINDEXED_STATES, unindexed, top)
            await connection.executemany(queries.SAVE_COUNT, [tuple(row) for row in counted])
        return [row["state"] for row in counted]

    async def counts(self) -> list[StateCount]:
        """The last count of each state counted so far."""
        async with self._db.connection(BACKGROUND_TIMEOUT_S) as connection:
            rows = await connection.fetch(queries.SELECT_COUNTS)
        return [
            StateCount(
                state=row["state"],
                by_key=dict(zip(row["routing_keys"], row["jobs"], strict=True)),
                other_jobs=row["other_jobs"],
                counted_at=row["counted_at"],
            )
            for row in rows
        ]

    async def next_due(self, limit: int) -> list[Due]:
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.NEXT_DUE, limit)
        return [
            Due(id=row["id"], routing_key=row["routing_key"], run_at=row["run_at"]) for row in rows
        ]

    async def next_due_by_minute(
        self, *, window_s: float, groups: int, scanned: int
    ) -> list[DueGroup]:
        """The jobs due within ``window_s`` (overdue ones too) per minute and routing key, the
        earliest ``groups`` groups, counted over at most the next ``scanned`` jobs."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.NEXT_DUE_BY_MINUTE, window_s, groups, scanned)
        return [
            DueGroup(minute=row["minute"], routing_key=row["routing_key"], jobs=row["jobs"])
            for row in rows
        ]
