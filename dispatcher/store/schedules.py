"""ScheduleStore: the only code that runs SQL on schedules; returns ``recurring.model`` records."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import orjson

from dispatcher import errors
from dispatcher.recurring.model import Schedule, ScheduleSpec, Template
from dispatcher.recurring.occurrences import Missed, Timing
from dispatcher.store.db import Database
from dispatcher.store.queries import schedules as queries

# A materialiser pass holds its rows while the intake stores their jobs: longer than an API call.
PASS_TIMEOUT_S = 30.0


def _aware(moment: datetime | None) -> datetime | None:
    """asyncpg reads -infinity and infinity as naive datetime.min and datetime.max: what
    0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z were stored as before the API bounded
    start_at and end_at. They are those instants, in UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _makes_more(current: Schedule, spec: ScheduleSpec, next_at: datetime | None) -> bool:
    """Whether a change may make the schedule fire more often than it does (a schedule stored
    over the quota before it was lowered keeps running, and may still be paused or retimed)."""
    if spec.paused or next_at is None:
        return False
    was_active = not current.spec.paused and current.next_at is not None
    return not was_active or spec.timing.jobs_per_hour() > current.spec.timing.jobs_per_hour()


async def _check_quota(
    connection: asyncpg.pool.PoolConnectionProxy,
    namespace: str | None,
    timing: Timing,
    leave_out: int | None,
    jobs_per_minute: float,
) -> None:
    """ScheduleQuotaReached when ``timing`` and the namespace's other active schedules would
    make more than ``jobs_per_minute`` together. Run under the namespace's lock."""
    rows = await connection.fetch(
        queries.ACTIVE_NAMESPACE_TIMINGS, namespace or "", leave_out if leave_out else 0
    )
    others = sum(_jobs_per_hour(timing_from_row(row)) for row in rows)
    total = (others + timing.jobs_per_hour()) / 60
    if total > jobs_per_minute:
        raise errors.ScheduleQuotaReached(
            f"the namespace's active schedules would make {total:g} jobs a minute; the quota is"
            f" {jobs_per_minute:g} (DISPATCHER_MAX_SCHEDULE_JOBS_PER_MINUTE)",
            field="interval_s" if timing.interval_s is not None else "cron",
        )


def _jobs_per_hour(timing: Timing) -> float:
    """A stored schedule's share of the quota; one this node cannot read (a cron expression an
    older node accepted) counts as busy as a cron expression can be, never as a failed request."""
    try:
        return timing.jobs_per_hour()
    except ValueError:  # CronError
        return 60.0


def timing_from_row(row: asyncpg.Record) -> Timing:
    start_at = _aware(row["start_at"])
    assert start_at is not None  # NOT NULL
    return Timing(
        cron=row["cron"],
        timezone=row["timezone"],
        interval_s=row["interval_s"],
        start_at=start_at,
        end_at=_aware(row["end_at"]),
    )


def schedule_from_row(row: asyncpg.Record) -> Schedule:
    return Schedule(
        id=row["id"],
        namespace=row["namespace"],
        spec=ScheduleSpec(
            name=row["name"],
            timing=timing_from_row(row),
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
        error=row["error"],
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


@dataclass(frozen=True, slots=True)
class Parked:
    """A schedule the materialiser pauses, and why."""

    schedule_id: int
    reason: str


# A schedule's new definition and next occurrence, from the stored one (the PATCH's merge).
Change = Callable[[Schedule], tuple[ScheduleSpec, datetime | None]]


class Lane:
    """The schedules one materialiser pass locked (``ScheduleStore.live`` and ``behind``), and the
    statements that finish it in their transaction. A row that cannot even be read as a schedule
    is in ``unreadable``, to be parked with the others."""

    def __init__(self, connection: asyncpg.pool.PoolConnectionProxy, rows: list[asyncpg.Record]):
        self._connection = connection
        self.schedules: list[Schedule] = []
        self.unreadable: list[Parked] = []
        for row in rows:
            try:
                self.schedules.append(schedule_from_row(row))
            except Exception as exc:  # one bad row must not fail the others' pass
                reason = f"cannot be read: {type(exc).__name__}: {exc}"
                self.unreadable.append(Parked(row["id"], reason[:500]))

    async def advance(self, advances: Sequence[Advance]) -> None:
        """Where each schedule goes on; called once their jobs are stored."""
        if advances:
            await self._connection.execute(
                queries.ADVANCE_SCHEDULES,
                [a.schedule_id for a in advances],
                [a.next_at for a in advances],
                [a.last_fired_at for a in advances],
            )

    async def park(self, parked: Sequence[Parked]) -> None:
        await self._connection.execute(
            queries.PARK_SCHEDULES,
            [p.schedule_id for p in parked],
            [p.reason for p in parked],
        )


class ScheduleStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self,
        spec: ScheduleSpec,
        *,
        namespace: str | None,
        next_at: datetime | None,
        limit: int | None = None,
        jobs_per_minute: float | None = None,
    ) -> Schedule:
        """Store a new schedule; ScheduleExists when its name is taken in the namespace,
        ScheduleLimitReached when the namespace holds ``limit`` schedules already,
        ScheduleQuotaReached when its active schedules would make more than ``jobs_per_minute``
        (each counted at its busiest hour)."""
        changeable = _changeable(spec)
        async with self._db.connection() as connection, connection.transaction():
            if limit is not None or jobs_per_minute is not None:
                await connection.execute(queries.LOCK_NAMESPACE_SCHEDULES, namespace or "")
            if jobs_per_minute is not None and not spec.paused and next_at is not None:
                await _check_quota(connection, namespace, spec.timing, None, jobs_per_minute)
            if limit is not None:
                count = await connection.fetchval(
                    queries.COUNT_NAMESPACE_SCHEDULES, namespace or ""
                )
                if count >= limit:
                    raise errors.ScheduleLimitReached(
                        f"the namespace has {count} schedules; the limit is {limit}"
                    )
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

    # ``routing_keys``: None for any routing key, else the words a key's prefixes name; a schedule
    # outside them is not found.

    async def get(
        self, name: str, *, namespace: str | None, routing_keys: Sequence[str] | None = None
    ) -> Schedule:
        async with self._db.connection() as connection:
            row = await connection.fetchrow(
                queries.SELECT_SCHEDULE, namespace or "", name, routing_keys
            )
        if row is None:
            raise errors.ScheduleNotFound()
        return schedule_from_row(row)

    async def page(
        self,
        *,
        namespace: str | None,
        after: int,
        limit: int,
        routing_keys: Sequence[str] | None = None,
        max_bytes: int = 2**62,
    ) -> tuple[list[Schedule], bool]:
        """A page, and whether more may follow (as ``JobStore.page``). ``namespace`` filters:
        None for every namespace, "" for the default one."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(
                queries.LIST_SCHEDULES, namespace, after, limit, routing_keys, max_bytes
            )
        more = bool(rows) and (len(rows) == limit or rows[0]["found"] > len(rows))
        return [schedule_from_row(row) for row in rows], more

    async def update(
        self,
        name: str,
        *,
        namespace: str | None,
        change: Change,
        routing_keys: Sequence[str] | None = None,
        jobs_per_minute: float | None = None,
    ) -> Schedule:
        """Apply ``change`` to the stored schedule under its row lock (so a materialiser pass on
        it finishes first, and the change sees the ``next_at`` that pass left);
        ScheduleQuotaReached as for ``create`` when it would make more jobs than before."""
        async with self._db.connection() as connection, connection.transaction():
            if jobs_per_minute is not None:  # first, as create takes it: no lock-order cycle
                await connection.execute(queries.LOCK_NAMESPACE_SCHEDULES, namespace or "")
            row = await connection.fetchrow(
                queries.LOCK_SCHEDULE, namespace or "", name, routing_keys
            )
            if row is None:
                raise errors.ScheduleNotFound()
            current = schedule_from_row(row)
            spec, next_at = change(current)
            if jobs_per_minute is not None and _makes_more(current, spec, next_at):
                await _check_quota(connection, namespace, spec.timing, current.id, jobs_per_minute)
            updated = await connection.fetchrow(
                queries.UPDATE_SCHEDULE, current.id, *_changeable(spec), next_at
            )
        assert updated is not None  # the row is locked: it is still there
        return schedule_from_row(updated)

    async def delete(
        self, name: str, *, namespace: str | None, routing_keys: Sequence[str] | None = None
    ) -> Schedule:
        async with self._db.connection() as connection:
            row = await connection.fetchrow(
                queries.DELETE_SCHEDULE, namespace or "", name, routing_keys
            )
        if row is None:
            raise errors.ScheduleNotFound()
        return schedule_from_row(row)

    @asynccontextmanager
    async def live(
        self, behind_before: datetime, horizon: datetime, limit: int
    ) -> AsyncIterator[Lane]:
        """Lock the active schedules whose next occurrence falls in ``[behind_before, horizon]``,
        earliest first, skipping those another node holds, until the block ends (commit, or
        rollback on error)."""
        async with self._db.connection(PASS_TIMEOUT_S) as connection, connection.transaction():
            rows = await connection.fetch(
                queries.CLAIM_LIVE_SCHEDULES, behind_before, horizon, limit
            )
            yield Lane(connection, rows)

    @asynccontextmanager
    async def behind(self, before: datetime, limit: int) -> AsyncIterator[Lane]:
        """Lock the active schedules whose next occurrence is before ``before``, least recently
        served first (a round robin), as ``live`` does."""
        async with self._db.connection(PASS_TIMEOUT_S) as connection, connection.transaction():
            rows = await connection.fetch(queries.CLAIM_BEHIND_SCHEDULES, before, limit)
            yield Lane(connection, rows)
