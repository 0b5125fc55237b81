"""ScheduleStore: the only code that runs SQL on schedules; returns ``schedules.model`` records."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import orjson

from dispatcher import errors
from dispatcher.schedules.model import Schedule, ScheduleSpec, Template
from dispatcher.schedules.occurrences import Missed, Timing
from dispatcher.store import queries
from dispatcher.store.db import Database

# A materialiser pass holds its rows while the intake stores their jobs: longer than an API call.
PASS_TIMEOUT_S = 30.0


def schedule_from_row(row: asyncpg.Record) -> Schedule:
    return Schedule(
        id=row["id"],
        namespace=row["namespace"],
        spec=ScheduleSpec(
            name=row["name"],
            timing=Timing(
                cron=row["cron"],
                timezone=row["timezone"],
                interval_s=row["interval_s"],
                start_at=row["start_at"],
                end_at=row["end_at"],
            ),
            template=Template(
                routing_key=row["routing_key"],
                payload=bytes(row["payload"]),
                headers=orjson.loads(row["headers"]),
                priority=row["priority"],
                ttl_ms=row["ttl_ms"],
            ),
            missed=Missed(row["missed"]),
            grace_s=row["grace_s"],
            paused=row["paused"],
        ),
        next_at=row["next_at"],
        last_fired_at=row["last_fired_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _changeable(spec: ScheduleSpec) -> tuple[object, ...]:
    """The columns a PATCH may set, in UPDATE_SCHEDULE's order ($2..$13)."""
    timing, template = spec.timing, spec.template
    return (
        timing.cron,
        timing.timezone,
        timing.interval_s,
        template.routing_key,
        template.payload,
        orjson.dumps(dict(template.headers)).decode(),
        template.priority,
        template.ttl_ms,
        timing.end_at,
        spec.missed.value,
        spec.grace_s,
        spec.paused,
    )


@dataclass(frozen=True, slots=True)
class Advance:
    """Where one schedule goes on after a pass."""

    schedule_id: int
    next_at: datetime | None
    last_fired_at: datetime | None


# A schedule's new definition and next occurrence, from the stored one (the PATCH's merge).
Change = Callable[[Schedule], tuple[ScheduleSpec, datetime | None]]


class ScheduleStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self, spec: ScheduleSpec, *, namespace: str | None, next_at: datetime | None
    ) -> Schedule:
        """Store a new schedule; ScheduleExists when its name is taken in the namespace."""
        changeable = _changeable(spec)
        async with self._db.connection() as connection:
            row = await connection.fetchrow(
                queries.INSERT_SCHEDULE,
                namespace,
                spec.name,
                *changeable[:8],
                spec.timing.start_at,
                *changeable[8:],
                next_at,
            )
        if row is None:
            raise errors.ScheduleExists()
        return schedule_from_row(row)

    async def get(self, name: str, *, namespace: str | None) -> Schedule:
        async with self._db.connection() as connection:
            row = await connection.fetchrow(queries.SELECT_SCHEDULE, namespace or "", name)
        if row is None:
            raise errors.ScheduleNotFound()
        return schedule_from_row(row)

    async def page(self, *, namespace: str | None, after: int, limit: int) -> list[Schedule]:
        """``namespace`` filters: None for every namespace, "" for the default one."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.LIST_SCHEDULES, namespace, after, limit)
        return [schedule_from_row(row) for row in rows]

    async def update(self, name: str, *, namespace: str | None, change: Change) -> Schedule:
        """Apply ``change`` to the stored schedule under its row lock (so a materialiser pass on
        it finishes first, and the change sees the ``next_at`` that pass left)."""
        async with self._db.connection() as connection, connection.transaction():
            row = await connection.fetchrow(queries.LOCK_SCHEDULE, namespace or "", name)
            if row is None:
                raise errors.ScheduleNotFound()
            current = schedule_from_row(row)
            spec, next_at = change(current)
            updated = await connection.fetchrow(
                queries.UPDATE_SCHEDULE, current.id, *_changeable(spec), next_at
            )
        assert updated is not None  # the row is locked: it is still there
        return schedule_from_row(updated)

    async def delete(self, name: str, *, namespace: str | None) -> Schedule:
        async with self._db.connection() as connection:
            row = await connection.fetchrow(queries.DELETE_SCHEDULE, namespace or "", name)
        if row is None:
            raise errors.ScheduleNotFound()
        return schedule_from_row(row)

    @asynccontextmanager
    async def due(
        self, horizon: datetime, limit: int
    ) -> AsyncIterator[tuple[list[Schedule], Callable[[Sequence[Advance]], Awaitable[None]]]]:
        """Lock the active schedules due before ``horizon`` (skipping those another node holds)
        for one pass. The block stores their jobs, then calls the second item with where each
        goes on; the locks are released when the block ends (commit, or rollback on error)."""
        async with self._db.connection(PASS_TIMEOUT_S) as connection, connection.transaction():
            rows = await connection.fetch(queries.CLAIM_DUE_SCHEDULES, horizon, limit)

            async def advance(advances: Sequence[Advance]) -> None:
                await connection.execute(
                    queries.ADVANCE_SCHEDULES,
                    [a.schedule_id for a in advances],
                    [a.next_at for a in advances],
                    [a.last_fired_at for a in advances],
                )

            yield [schedule_from_row(row) for row in rows], advance
