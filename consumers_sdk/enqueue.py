"""enqueue(): schedule a job inside the caller's own PostgreSQL transaction.

For applications whose data lives in the dispatcher's database: the job row is written on the
caller's connection, so it exists if and only if the caller's transaction commits. Nothing here
opens a transaction or commits; on a connection outside any transaction the statement commits by
itself (as ``POST /v1/jobs`` would). The row is written by the database's contract function
``dispatcher_enqueue_v1`` (created by the dispatcher's migration 0012; the dispatcher's own intake
calls it too), which also sends the due notice that PostgreSQL delivers only on commit: the
dispatcher nodes listen and put a job due soon on the owning node's heap at once; the loader (or
its safety sweep) picks it up otherwise.

Inputs are checked as the HTTP API checks them (``validation``), before any SQL runs: a refused
job raises ValueError or TypeError naming the argument, and the caller's transaction is untouched.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson

try:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy
except ImportError as missing:  # the SDK installs without it: enqueue is the one part that needs it
    raise ImportError(
        "consumers_sdk.enqueue needs asyncpg: pip install 'delay-dispatcher-sdk[asyncpg]'",
        name=missing.name,
    ) from missing

from consumers_sdk import contract, ids, tracing, validation

# Insert one job, through the contract function with one-element arrays (one function serves
# the dispatcher's batches and this): a shard chosen by the id's hash among the shards the
# dispatcher created, and a due notice once the transaction commits. An idempotency key seen
# before in the namespace inserts (and notifies) nothing.
# $1 id, $2 id hash, $3 routing key, $4 payload, $5 headers (JSON text), $6 priority, $7 ttl_ms,
# $8 idempotency key, $9 run_at, $10 namespace (NULL: the default one).
INSERT_JOB: Final = """
SELECT id, run_at
FROM dispatcher_enqueue_v1(ARRAY[$1::uuid], NULL, ARRAY[$2::bigint], ARRAY[$3::text],
                           ARRAY[$4::bytea], ARRAY[$5::jsonb], ARRAY[$6::smallint],
                           ARRAY[$7::bigint], ARRAY[$8::text], ARRAY[$9::timestamptz],
                           ARRAY[$10::text], true)
"""

# The job stored earlier under an idempotency key. $1 namespace ('' for the default), $2 key.
SELECT_BY_KEY: Final = """
SELECT id, run_at FROM jobs WHERE coalesce(namespace, '') = $1 AND idempotency_key = $2
"""

Connection = asyncpg.Connection | PoolConnectionProxy
_PAYLOAD_OPTIONS: Final = (  # refuse what the API could not receive as JSON (dates, dataclasses)
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


class NoShards(RuntimeError):
    """The database has no shards yet: start a dispatcher on it once before enqueuing."""


class SchemaTooOld(RuntimeError):
    """The database lacks dispatcher_enqueue_v1: migrate it with a newer dispatcher first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueuedJob:
    id: uuid.UUID
    run_at: datetime
    created: bool  # False: the idempotency key found the job stored earlier


_IDS = ids.JobIds()  # one generator per process: its ids are strictly increasing


async def enqueue(
    conn: Connection,
    routing_key: str,
    payload: Any,
    *,
    delay: timedelta | float | None = None,
    run_at: datetime | None = None,
    headers: Mapping[str, contract.HeaderValue] | None = None,
    priority: int | None = None,
    ttl: timedelta | float | None = None,
    idempotency_key: str | None = None,
    namespace: str | None = None,
    max_attempts: int | None = None,
    retry_backoff: Sequence[timedelta | float] | None = None,
    limits: validation.Limits = validation.DEFAULT_LIMITS,
) -> EnqueuedJob:
    """Schedule a job on ``conn`` within whatever transaction it is in.

    ``delay`` (a timedelta or seconds) or ``run_at`` (timezone-aware; in the past means now),
    neither means now. ``max_attempts`` and ``retry_backoff`` (seconds after each failed attempt,
    the last repeated) are the job's own retry policy. ``limits`` are the dispatcher's
    ``DISPATCHER_MAX_*`` settings, when they differ from the defaults.
    """
    job_id = _IDS.next()
    arguments = (  # each checked (raising before any SQL) and encoded as INSERT_JOB takes it
        job_id,
        ids.id_hash(job_id.bytes),
        _routing_key(routing_key, limits),
        _payload(payload, limits),
        _headers(tracing.inject(headers), max_attempts, retry_backoff, limits),
        _priority(priority),
        _ttl_ms(ttl),
        _idempotency_key(idempotency_key, limits),
        _run_at(delay, run_at, limits),
        _namespace(namespace),
    )
    try:
        inserted = await conn.fetchrow(INSERT_JOB, *arguments)
    except asyncpg.DivisionByZeroError:  # count(*) of shard_epochs was 0
        raise NoShards(NoShards.__doc__) from None
    except asyncpg.UndefinedFunctionError:  # a dispatcher before migration 0012
        raise SchemaTooOld(SchemaTooOld.__doc__) from None
    if inserted is not None:
        return EnqueuedJob(id=inserted["id"], run_at=inserted["run_at"], created=True)
    existing = await conn.fetchrow(SELECT_BY_KEY, namespace or "", idempotency_key)
    if existing is None:  # deleted (retention) between the conflict and this read
        raise RuntimeError("the job stored under this idempotency key is gone; enqueue again")
    return EnqueuedJob(id=existing["id"], run_at=existing["run_at"], created=False)


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
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 9
    ):
        raise ValueError("priority must be an integer from 0 to 9")
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


def _seconds(argument: str, value: timedelta | float) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a timedelta or a number of seconds")
    if not math.isfinite(value):
        raise ValueError(f"{argument} must be finite")
    return float(value)


def _run_at(
    delay: timedelta | float | None, run_at: datetime | None, limits: validation.Limits
) -> datetime:
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
    return due


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
