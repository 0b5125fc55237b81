"""enqueue() and enqueue_sync(): schedule a job inside the caller's own PostgreSQL transaction.

For applications whose data lives in the dispatcher's database: the job row is written on the
caller's connection (asyncpg or psycopg 3 async for ``enqueue``, psycopg 3 sync, Django's among
them, for ``enqueue_sync``: ``sql_drivers``), so it exists if and only if the caller's transaction
commits. Nothing here opens a transaction or commits; on a connection in autocommit (asyncpg
outside a transaction, Django outside ``atomic``) the statement commits by itself (as
``POST /v1/jobs`` would). The row is written by the database's contract function
``dispatcher_enqueue_v1`` (created by the dispatcher's migration 0012; the dispatcher's own intake
calls it too), which also sends the due notice that PostgreSQL delivers only on commit: the
dispatcher nodes listen and put a job due soon on the owning node's heap at once; the loader (or
its safety sweep) picks it up otherwise. A job that asks more of its idempotency key
(``on_existing`` replace or extend, a ``release_key``) goes through ``dispatcher_enqueue_v2``
(migration 0019) instead, which may change the pending job the key names; every other job keeps
to v1, so a database migrated before 0019 still takes it.

Inputs are checked as the HTTP API checks them (``validation``), before any SQL runs: a refused
job raises ValueError or TypeError naming the argument, and the caller's transaction is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypedDict, Unpack

import orjson

from consumers_sdk import calls, contract, ids, sql_drivers, tracing, validation

if TYPE_CHECKING:
    from consumers_sdk.sql_drivers import AsyncConnection, SyncConnection

# Insert one job, through the contract function with one-element arrays (one function serves
# the dispatcher's batches and this): a shard chosen by the id's hash among the shards the
# dispatcher created, and a due notice once the transaction commits. An idempotency key seen
# before in the namespace inserts (and notifies) nothing.
# A delay counts from PostgreSQL's clock, the one the dispatcher fires on, not this host's.
# $1 id, $2 id hash, $3 routing key, $4 payload, $5 headers (JSON text), $6 priority, $7 ttl_ms,
# $8 idempotency key, $9 run_at (NULL: $11 seconds from now), $10 namespace (NULL: the default
# one), $11 the delay in seconds.
INSERT_JOB: Final = """
SELECT id, run_at
FROM dispatcher_enqueue_v1(ARRAY[$1::uuid], NULL, ARRAY[$2::bigint], ARRAY[$3::text],
                           ARRAY[$4::bytea], ARRAY[$5::jsonb], ARRAY[$6::smallint],
                           ARRAY[$7::bigint], ARRAY[$8::text],
                           ARRAY[coalesce($9::timestamptz,
                                          clock_timestamp() + make_interval(secs => $11::float8))],
                           ARRAY[$10::text], true)
"""

# INSERT_JOB through ``dispatcher_enqueue_v2`` (sql/0019), for a job whose known key replaces or
# extends the pending job it names (as each change, a step of that job's history by 'enqueue',
# and a due notice on commit), or that lets go of its key: one row whatever happened, the id and
# run_at of the job answered (the new one, or the one the key names, as it stands now) and the
# outcome (created, kept, replaced, extended, refused). $1..$11 as INSERT_JOB's, $12 when the job
# lets go of its key (NULL: never), $13 on_existing.
ENQUEUE_JOB: Final = """
SELECT id, run_at, outcome
FROM dispatcher_enqueue_v2(ARRAY[$1::uuid], NULL, ARRAY[$2::bigint], ARRAY[$3::text],
                           ARRAY[$4::bytea], ARRAY[$5::jsonb], ARRAY[$6::smallint],
                           ARRAY[$7::bigint], ARRAY[$8::text],
                           ARRAY[coalesce($9::timestamptz,
                                          clock_timestamp() + make_interval(secs => $11::float8))],
                           ARRAY[$10::text], ARRAY[$12::text], ARRAY[$13::text], true, 'enqueue')
"""

# The job stored earlier under an idempotency key. $1 namespace ('' for the default), $2 key.
# Both statements run on asyncpg and on psycopg's raw cursors alike (sql_drivers).
SELECT_BY_KEY: Final = """
SELECT id, run_at FROM jobs WHERE coalesce(namespace, '') = $1 AND idempotency_key = $2
"""

_PAYLOAD_OPTIONS: Final = (  # refuse what the API could not receive as JSON (dates, dataclasses)
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


class NoShards(RuntimeError):
    """The database has no shards yet: start a dispatcher on it once before enqueuing."""


# dispatcher_enqueue_v1 (migration 0012) for every job; v2 (0019) for on_existing and release_key.
class SchemaTooOld(RuntimeError):
    """The database lacks enqueue's contract function: migrate it with a newer dispatcher first."""


# What the statements' errors mean, by SQLSTATE (the same on every driver).
_REFUSALS: Final[dict[str, type[RuntimeError]]] = {
    "22012": NoShards,  # division_by_zero: count(*) of shard_epochs was 0
    "42883": SchemaTooOld,  # undefined_function: a dispatcher before migration 0012 (v2: 0019)
}


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueuedJob:
    id: str  # canonical hyphenated text, as every job id the SDK answers (``JobRecord.id``)
    run_at: datetime
    created: bool  # False: the idempotency key found the job stored earlier
    outcome: str  # created, kept, replaced, extended or refused (as ``JobRecord.outcome``)


_IDS = ids.JobIds()  # one generator per process: its ids are strictly increasing


class EnqueueOptions(TypedDict, total=False):
    """The keyword arguments of ``enqueue`` and ``enqueue_sync``; each may be left out.

    ``delay`` (a timedelta or seconds) or ``run_at`` (timezone-aware; in the past means now),
    neither means now. ``max_attempts`` and ``retry_backoff`` (seconds after each failed attempt,
    the last repeated) are the job's own retry policy. ``on_existing`` (``keep``, ``replace``,
    ``extend``) and ``release_key`` (``never``, ``dispatched``, ``finished``) are the API's, and
    need ``idempotency_key``. ``limits`` are the dispatcher's ``DISPATCHER_MAX_*`` settings, when
    they differ from the defaults.
    """

    delay: timedelta | float | None
    run_at: datetime | None
    headers: Mapping[str, contract.HeaderValue] | None
    priority: int | None
    ttl: timedelta | float | None
    idempotency_key: str | None
    namespace: str | None
    max_attempts: int | None
    retry_backoff: Sequence[timedelta | float] | None
    on_existing: validation.OnExisting | None
    release_key: validation.KeyRelease | None
    limits: validation.Limits


async def enqueue(
    conn: AsyncConnection, routing_key: str, payload: Any, **options: Unpack[EnqueueOptions]
) -> EnqueuedJob:
    """Schedule a job on ``conn`` (asyncpg, or psycopg's ``AsyncConnection``) within whatever
    transaction it is in. The options are ``EnqueueOptions``."""
    arguments = _arguments(routing_key, payload, options)
    levers = _levers(options)
    with _refusals():
        if levers is not None:
            return _changed(await sql_drivers.fetch_row(conn, ENQUEUE_JOB, arguments + levers))
        inserted = await sql_drivers.fetch_row(conn, INSERT_JOB, arguments)
        stored = inserted or await sql_drivers.fetch_row(conn, SELECT_BY_KEY, _key(options))
        if stored is None:  # its job let go of the key since the insert: v2 tries again
            return _changed(await sql_drivers.fetch_row(conn, ENQUEUE_JOB, arguments + _KEPT))
    return _enqueued(stored, created=inserted is not None)


def enqueue_sync(
    conn: SyncConnection, routing_key: str, payload: Any, **options: Unpack[EnqueueOptions]
) -> EnqueuedJob:
    """``enqueue`` on a synchronous psycopg 3 ``Connection``: in Django, the one under
    ``django.db.connection`` (``consumers_sdk.integrations.django.psycopg_connection()``), so a
    job joins ``transaction.atomic()``. The options and errors are ``enqueue``'s."""
    arguments = _arguments(routing_key, payload, options)
    levers = _levers(options)
    with _refusals():
        if levers is not None:
            return _changed(sql_drivers.fetch_row_sync(conn, ENQUEUE_JOB, arguments + levers))
        inserted = sql_drivers.fetch_row_sync(conn, INSERT_JOB, arguments)
        stored = inserted or sql_drivers.fetch_row_sync(conn, SELECT_BY_KEY, _key(options))
        if stored is None:  # its job let go of the key since the insert: v2 tries again
            return _changed(sql_drivers.fetch_row_sync(conn, ENQUEUE_JOB, arguments + _KEPT))
    return _enqueued(stored, created=inserted is not None)


def _arguments(routing_key: str, payload: Any, options: EnqueueOptions) -> tuple[object, ...]:
    """INSERT_JOB's arguments, each checked (raising before any SQL runs) and encoded."""
    unknown = sorted(options.keys() - EnqueueOptions.__optional_keys__)
    if unknown:  # a misspelt option would otherwise be dropped without a word
        raise TypeError(f"{unknown[0]} is not an argument of enqueue")
    limits = options.get("limits", validation.DEFAULT_LIMITS)
    run_at, delay_s = _due(options.get("delay"), options.get("run_at"), limits)
    job_id = _IDS.next()
    return (
        job_id,
        ids.id_hash(job_id.bytes),
        _routing_key(routing_key, limits),
        _payload(payload, limits),
        _headers(
            tracing.inject(options.get("headers")),
            options.get("max_attempts"),
            options.get("retry_backoff"),
            limits,
        ),
        _priority(options.get("priority")),
        _ttl_ms(options.get("ttl")),
        _idempotency_key(options.get("idempotency_key"), limits),
        run_at,
        _namespace(options.get("namespace")),
        delay_s,
    )


def _levers(options: EnqueueOptions) -> tuple[str | None, str] | None:
    """ENQUEUE_JOB's own arguments (the key release, NULL for never; on_existing), checked as
    the API checks them; None when both are the defaults, for INSERT_JOB."""
    on_existing, release_key = options.get("on_existing"), options.get("release_key")
    on_existing = "keep" if on_existing is None else on_existing
    release_key = "never" if release_key is None else release_key
    _check_text("on_existing", on_existing)
    _check_text("release_key", release_key)
    found = validation.key_levers_problem(options.get("idempotency_key"), on_existing, release_key)
    if found is not None:
        raise ValueError(f"{found[0]} {found[1]}")
    if (on_existing, release_key) == ("keep", "never"):
        return None
    return (None if release_key == "never" else release_key), on_existing


def _key(options: EnqueueOptions) -> tuple[str, str | None]:
    """SELECT_BY_KEY's arguments: where a job not inserted (its key seen before) is stored."""
    return options.get("namespace") or "", options.get("idempotency_key")


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """The driver's error for a database that cannot take jobs, as NoShards or SchemaTooOld."""
    try:
        yield
    except Exception as exc:
        refusal = _REFUSALS.get(getattr(exc, "sqlstate", None) or "")
        if refusal is None:
            raise
        raise refusal(refusal.__doc__) from None


# ENQUEUE_JOB's levers for a job that keeps what its key names and holds its key while stored.
_KEPT: Final = (None, "keep")


def _enqueued(row: sql_drivers.Row, *, created: bool) -> EnqueuedJob:
    job_id, run_at = row
    # psycopg gives the session's time zone, asyncpg UTC: one answer whatever the driver.
    return EnqueuedJob(
        id=str(job_id),
        run_at=run_at.astimezone(UTC),
        created=created,
        outcome="created" if created else "kept",
    )


def _changed(row: sql_drivers.Row | None) -> EnqueuedJob:
    """ENQUEUE_JOB's row (the function answers one for every job) as an EnqueuedJob."""
    assert row is not None
    job_id, run_at, outcome = row
    created = outcome == "created"
    return EnqueuedJob(
        id=str(job_id), run_at=run_at.astimezone(UTC), created=created, outcome=outcome
    )


def _routing_key(value: str, limits: validation.Limits) -> str:
    _check_text("routing_key", value)
    _refuse("routing_key", validation.routing_key_problem(value, limits.max_routing_key_bytes))
    return value


def _headers(
    headers: Mapping[str, contract.HeaderValue] | None,
    max_attempts: int | None,
    retry_backoff: Sequence[timedelta | float] | None,
    limits: validation.Limits,
) -> str:
    """The producer's headers and the job's retry policy, as the JSON text of the column."""
    user_headers = dict(headers or {})
    found = validation.headers_problem(user_headers, limits)
    if found is not None:
        raise ValueError(f"{found[0]}: {found[1]}")
    return orjson.dumps({**user_headers, **_policy(max_attempts, retry_backoff)}).decode()


def _priority(value: int | None) -> int | None:
    if value is not None and (problem := validation.priority_problem(value)):
        raise ValueError(f"priority {problem}")
    return value


def _idempotency_key(value: str | None, limits: validation.Limits) -> str | None:
    if value is not None:
        _check_text("idempotency_key", value)
        _refuse("idempotency_key", validation.idempotency_key_problem(value, limits))
    return value


def _namespace(value: str | None) -> str | None:
    if value is not None:
        _check_text("namespace", value)
        _refuse("namespace", validation.unstorable(value) if value else "must not be empty")
    return value


def _refuse(argument: str, problem: str | None) -> None:
    if problem is not None:
        raise ValueError(f"{argument} {problem}")


def _check_text(argument: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, not {type(value).__name__}")


_seconds = calls.seconds  # one rule for durations, the client's


def _due(
    delay: timedelta | float | None, run_at: datetime | None, limits: validation.Limits
) -> tuple[datetime | None, float]:
    """INSERT_JOB's run_at and delay: a run_at as given (in UTC), or none and the delay, which
    PostgreSQL adds to its own clock. Checked against this host's clock (the limit is days)."""
    if delay is not None and run_at is not None:
        raise ValueError("delay and run_at: give one, not both")
    argument, delay_s = "delay", 0.0
    if run_at is not None:
        argument = "run_at"
        if not isinstance(run_at, datetime):
            raise TypeError("run_at must be a datetime")
        if run_at.utcoffset() is None:
            raise ValueError("run_at must be timezone-aware")
    elif delay is not None and (delay_s := _seconds("delay", delay)) < 0:
        raise ValueError("delay must not be negative")
    now = datetime.now(UTC)
    try:  # a year past 9999 (or before 1) once in UTC cannot be stored
        due = run_at.astimezone(UTC) if run_at is not None else now + timedelta(seconds=delay_s)
    except OverflowError:
        raise ValueError(f"{argument} is out of range") from None
    _refuse(argument, validation.due_problem(due, now, limits))
    return (due if run_at is not None else None), delay_s


def _payload(payload: Any, limits: validation.Limits) -> bytes:
    try:
        encoded = orjson.dumps(payload, option=_PAYLOAD_OPTIONS)
    except TypeError as exc:  # not JSON, or an integer past 64 bits, or a lone surrogate
        raise TypeError(f"payload cannot be encoded as JSON: {exc}") from None
    if len(encoded) > limits.max_payload_bytes:
        raise ValueError(
            f"payload is {len(encoded)} bytes encoded, over the limit of {limits.max_payload_bytes}"
        )
    return encoded


def _ttl_ms(ttl: timedelta | float | None) -> int | None:
    if ttl is None:
        return None
    seconds = _seconds("ttl", ttl)
    ttl_ms = round(seconds * 1000) if abs(seconds) < validation.INT64_MAX / 1000 else -1
    _refuse("ttl", validation.ttl_ms_problem(ttl_ms))
    return ttl_ms


def _policy(
    max_attempts: int | None, retry_backoff: Sequence[timedelta | float] | None
) -> dict[str, contract.HeaderValue]:
    if max_attempts is not None:
        _refuse("max_attempts", validation.max_attempts_problem(max_attempts))
    backoff_s = None
    if retry_backoff is not None:
        if isinstance(retry_backoff, str | bytes) or not isinstance(retry_backoff, Sequence):
            raise TypeError("retry_backoff must be a sequence of timedeltas or seconds")
        backoff_s = [_seconds("retry_backoff", step) for step in retry_backoff]
        found = validation.retry_backoff_problem(backoff_s)
        if found is not None:
            raise ValueError(f"retry_backoff{found[0]} {found[1]}")
    return contract.retry_policy_headers(max_attempts=max_attempts, backoff_s=backoff_s)
