"""Every request the client can make, built without I/O: method, path, query, JSON body, whether
replaying it after a lost answer is harmless, and how its answer becomes a record. The async and
the sync client send the same ``Call``s (``exchange`` runs them), so the two cannot drift apart.

Durations are a ``timedelta`` or a number of seconds, everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, TypedDict, TypeVar, Unpack
from urllib.parse import quote

from consumers_sdk import contract, records, tracing, validation

T = TypeVar("T")
Duration = timedelta | float
Subject = Literal["job", "schedule", "limit", "bulk"]  # what a 404/409/422 is about
JOBS = "/v1/jobs"
SCHEDULES = "/v1/schedules"
LIMITS = "/v1/limits"
BULK_ACTIONS = "/v1/bulk-actions"


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T] = field(repr=False)
    json: Any = None
    params: Mapping[str, object] = field(default_factory=dict)
    replay_safe: bool = False  # sending it twice does what sending it once does
    subject: Subject = "job"


class JobOptions(TypedDict, total=False):
    delay: Duration  # or run_at, not both; neither means now
    run_at: datetime  # timezone-aware
    idempotency_key: str
    headers: Mapping[str, contract.HeaderValue]
    priority: int  # 0-9
    ttl: Duration
    after: Sequence[str]  # ids of jobs that must succeed first
    max_attempts: int  # this job's own retry policy, over the consumer's defaults
    retry_backoff: Sequence[Duration]  # after each failed attempt, the last repeated
    # What a known idempotency key does to the pending job it names: keep it (the default),
    # replace it (this run_at, payload, headers, priority and ttl), or extend it (this run_at if
    # later: a debounce). Needs idempotency_key.
    on_existing: validation.OnExisting
    # When the job lets go of its key, so the next submit of it makes a new job: never (the
    # default), once dispatched, or once finished. Needs idempotency_key.
    release_key: validation.KeyRelease


class JobFilters(TypedDict, total=False):
    """The filters of ``GET /v1/jobs``."""

    state: str  # scheduled, waiting, dispatching, dispatched, succeeded, dead, cancelled, expired
    routing_key: str
    routing_key_prefix: str  # these words or below: billing (or billing.) lists billing.charge
    idempotency_key: str  # the jobs stored under this key (one per namespace)


class JobChange(TypedDict, total=False):
    """What ``reschedule`` changes; what is left out is kept (``priority=None`` removes it)."""

    delay: Duration
    run_at: datetime
    payload: Any
    priority: int | None


class ScheduleOptions(TypedDict, total=False):
    """A schedule's timing (``cron`` or ``interval``) and the rest of its definition."""

    cron: str  # five fields, in ``timezone``
    interval: Duration  # whole seconds
    timezone: str  # IANA name; UTC by default
    headers: Mapping[str, contract.HeaderValue]
    priority: int
    ttl: Duration
    start_at: datetime
    end_at: datetime
    missed: Literal["all", "latest", "skip"]
    grace: Duration
    paused: bool


class ScheduleChange(TypedDict, total=False):
    """What ``schedules.change`` changes; what is left out is kept (``end_at=None`` removes the
    end; giving ``cron`` drops the interval and the other way round)."""

    cron: str
    interval: Duration
    timezone: str
    job: records.JobTemplate
    end_at: datetime | None
    missed: Literal["all", "latest", "skip"]
    grace: Duration
    paused: bool


def seconds(argument: str, value: Duration) -> float:
    """A duration given as a ``timedelta`` or as seconds; TypeError/ValueError naming it."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a timedelta or a number of seconds")
    if not math.isfinite(value):
        raise ValueError(f"{argument} must be finite")
    return float(value)


def _ms(argument: str, value: Duration) -> int:
    return round(seconds(argument, value) * 1000)


def _time(argument: str, value: datetime) -> str:
    if not isinstance(value, datetime):
        raise TypeError(f"{argument} must be a datetime")
    if value.utcoffset() is None:
        raise ValueError(f"{argument} must be timezone-aware")
    return value.isoformat()


def _when(options: JobOptions | JobChange) -> dict[str, Any]:
    delay, run_at = options.get("delay"), options.get("run_at")
    if delay is not None and run_at is not None:
        raise ValueError("give delay or run_at, not both")
    if delay is not None:
        return {"delay_ms": max(0, _ms("delay", delay))}  # a delay already past: due now
    return {} if run_at is None else {"run_at": _time("run_at", run_at)}


def job_headers(
    given: Mapping[str, contract.HeaderValue] | None,
) -> dict[str, contract.HeaderValue]:
    """The headers a new job carries: the caller's, plus the current span's ``traceparent`` when
    OpenTelemetry is on. The one place both clients (and every item of ``schedule_many``) build
    them."""
    return dict(tracing.inject(given) or {})


def job_body(routing_key: str, payload: Any, **options: Unpack[JobOptions]) -> dict[str, Any]:
    """The JSON of one job, as ``POST /v1/jobs`` (and each item of ``schedule_many``) takes it."""
    body: dict[str, Any] = {"routing_key": routing_key, "payload": payload, **_when(options)}
    headers = job_headers(options.get("headers"))
    ttl, after = options.get("ttl"), options.get("after")
    backoff = options.get("retry_backoff")
    optional: dict[str, Any] = {
        "idempotency_key": options.get("idempotency_key"),
        "headers": headers or None,
        "priority": options.get("priority"),
        "ttl_ms": None if ttl is None else _ms("ttl", ttl),
        "after": list(after) if after else None,
        "max_attempts": options.get("max_attempts"),
        "retry_backoff_s": None
        if backoff is None
        else [seconds("retry_backoff", step) for step in backoff],
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    # Sent only when not the default: a dispatcher older than them refuses the fields, and a
    # producer that does not use them keeps working against it. The node checks them (a 422
    # naming the field), as it checks every other field.
    on_existing, release_key = options.get("on_existing"), options.get("release_key")
    if on_existing not in (None, "keep"):
        body["on_existing"] = on_existing
    if release_key not in (None, "never"):
        body["release_key"] = release_key
    return body


def _replay_safe(job: Mapping[str, Any]) -> bool:
    """Whether sending this job again after a lost answer does what sending it once did.

    Only a key makes it so: the replay finds the job the first send stored. A key the job may let
    go of (``release_key``) does not: the job can be dispatched before the replay, which would
    then create a second one. A replace or extend to a ``run_at`` is idempotent in effect: the
    replay sets the same values (its answer may read ``kept``, or ``refused`` if the job was
    dispatched meanwhile, though the change was made); one to a ``delay`` is not, the delay
    counting again from the replay (as ``reschedule``'s).
    """
    if not job.get("idempotency_key") or job.get("release_key", "never") != "never":
        return False
    return job.get("on_existing", "keep") == "keep" or "delay_ms" not in job


def _job_path(job_id: str) -> str:
    return f"{JOBS}/{quote(str(job_id), safe='')}"


def _schedule_path(name: str) -> str:
    return f"{SCHEDULES}/{quote(name, safe='')}"


def schedule(
    routing_key: str, payload: Any, **options: Unpack[JobOptions]
) -> Call[records.JobRecord]:
    body = job_body(routing_key, payload, **options)
    return Call(
        method="POST", path=JOBS, json=body, parse=records.job, replay_safe=_replay_safe(body)
    )


def schedule_batch(jobs: Sequence[Mapping[str, Any]]) -> Call[tuple[records.JobRecord, ...]]:
    """One batch of ``job_body(...)`` items, stored all or nothing by the API."""
    replay_safe = all(_replay_safe(job) for job in jobs)
    return Call(
        method="POST",
        path=f"{JOBS}/batch",
        json={"jobs": [dict(job) for job in jobs]},
        parse=records.jobs,
        replay_safe=replay_safe,
    )


def get(job_id: str) -> Call[records.JobRecord]:
    return Call(method="GET", path=_job_path(job_id), parse=records.job, replay_safe=True)


def page(
    *, after: str | None = None, limit: int = 100, **filters: Unpack[JobFilters]
) -> Call[records.JobPage]:
    """A page of ``GET /v1/jobs`` with its filters (``idempotency_key``: the jobs under it)."""
    params: dict[str, object] = {"limit": limit}
    if after is not None:
        params["after"] = after
    params.update({key: value for key, value in filters.items() if value is not None})
    return Call(method="GET", path=JOBS, params=params, parse=records.job_page, replay_safe=True)


def reschedule(job_id: str, **change: Unpack[JobChange]) -> Call[records.JobRecord]:
    body = _when(change)
    if "payload" in change:
        body["payload"] = change["payload"]
    if "priority" in change:
        body["priority"] = change["priority"]
    if not body:
        raise ValueError("give delay, run_at, payload or priority to change")
    # Sent twice, the same run_at, payload and priority leave the job as once; a delay would
    # count again from the replay.
    return Call(
        method="PATCH",
        path=_job_path(job_id),
        json=body,
        parse=records.job,
        replay_safe="delay_ms" not in body,
    )


def cancel(job_id: str) -> Call[records.JobRecord]:
    # Not replayed after a lost answer: the replay would report the job as already cancelled.
    return Call(method="DELETE", path=_job_path(job_id), parse=records.job)


def requeue(job_id: str) -> Call[records.JobRecord]:
    # Not replayed either: the first send may have requeued it, and it may have run since.
    return Call(method="POST", path=f"{_job_path(job_id)}/requeue", parse=records.job)


def _template(job: records.JobTemplate) -> dict[str, Any]:
    return {
        "routing_key": job.routing_key,
        "payload": job.payload,
        "headers": dict(job.headers),
        "priority": job.priority,
        "ttl_ms": job.ttl_ms,
    }


def _interval_s(value: Duration) -> int:
    interval = seconds("interval", value)
    if interval != int(interval):
        raise ValueError("interval must be whole seconds")
    return int(interval)


def _timing(options: ScheduleOptions | ScheduleChange) -> dict[str, Any]:
    """The fields both a new schedule and a change take, as the API names them."""
    body: dict[str, Any] = {}
    if "interval" in options:
        body["interval_s"] = _interval_s(options["interval"])
    if "grace" in options:
        body["grace_s"] = seconds("grace", options["grace"])
    if "end_at" in options:
        end_at = options["end_at"]
        body["end_at"] = None if end_at is None else _time("end_at", end_at)
    if "cron" in options:
        body["cron"] = options["cron"]
    if "timezone" in options:
        body["timezone"] = options["timezone"]
    if "missed" in options:
        body["missed"] = options["missed"]
    if "paused" in options:
        body["paused"] = options["paused"]
    return body


def create_schedule(
    name: str, routing_key: str, payload: Any, **options: Unpack[ScheduleOptions]
) -> Call[records.Schedule]:
    ttl = options.get("ttl")
    job = records.JobTemplate(
        routing_key=routing_key,
        payload=payload,
        headers=dict(options.get("headers") or {}),
        priority=options.get("priority"),
        ttl_ms=None if ttl is None else _ms("ttl", ttl),
    )
    body: dict[str, Any] = {"name": name, "job": _template(job), **_timing(options)}
    if "start_at" in options:
        body["start_at"] = _time("start_at", options["start_at"])
    # Not replayed: a replay of a create that did happen would answer 409 (the name is taken).
    return Call(
        method="POST", path=SCHEDULES, json=body, parse=records.schedule, subject="schedule"
    )


def get_schedule(name: str) -> Call[records.Schedule]:
    return Call(
        method="GET",
        path=_schedule_path(name),
        parse=records.schedule,
        replay_safe=True,
        subject="schedule",
    )


def schedule_page(*, after: int = 0, limit: int = 100) -> Call[records.SchedulePage]:
    return Call(
        method="GET",
        path=SCHEDULES,
        params={"after": after, "limit": limit},
        parse=records.schedule_page,
        replay_safe=True,
        subject="schedule",
    )


def change_schedule(name: str, **change: Unpack[ScheduleChange]) -> Call[records.Schedule]:
    body = _timing(change)
    if "job" in change:
        body["job"] = _template(change["job"])
    if not body:
        raise ValueError("give something to change")
    # The same change sent twice leaves the schedule as once.
    return Call(
        method="PATCH",
        path=_schedule_path(name),
        json=body,
        parse=records.schedule,
        replay_safe=True,
        subject="schedule",
    )


def delete_schedule(name: str) -> Call[records.Schedule]:
    return Call(
        method="DELETE", path=_schedule_path(name), parse=records.schedule, subject="schedule"
    )


# --- flow rules (/v1/limits) -------------------------------------------------------------------


def _limit_path(key: str) -> str:
    return f"{LIMITS}/{quote(key, safe='')}"


def _scope(namespace: str | None) -> dict[str, object]:
    return {} if namespace is None else {"namespace": namespace}


def limits(*, namespace: str | None = None) -> Call[tuple[records.FlowRule, ...]]:
    return Call(
        method="GET",
        path=LIMITS,
        params=_scope(namespace),
        parse=records.flow_rules,
        replay_safe=True,
        subject="limit",
    )


def get_limit(key: str, *, namespace: str | None = None) -> Call[records.FlowRule]:
    return Call(
        method="GET",
        path=_limit_path(key),
        params=_scope(namespace),
        parse=records.flow_rule,
        replay_safe=True,
        subject="limit",
    )


def put_limit(
    key: str,
    *,
    namespace: str | None = None,
    paused: bool = False,
    paused_until: datetime | None = None,
    note: str | None = None,
    rate_per_s: float | None = None,
    burst: int | None = None,
    max_in_flight: int | None = None,
    in_flight_timeout_s: Duration | None = None,
) -> Call[records.FlowRule]:
    body: dict[str, Any] = {"paused": paused, "note": note}
    optional: dict[str, Any] = {
        "paused_until": None if paused_until is None else _time("paused_until", paused_until),
        "rate_per_s": rate_per_s,
        "burst": burst,
        "max_in_flight": max_in_flight,
        "in_flight_timeout_s": None
        if in_flight_timeout_s is None
        else seconds("in_flight_timeout_s", in_flight_timeout_s),
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    # A PUT replaces the rule whole: sent twice, the rule is as after once.
    return Call(
        method="PUT",
        path=_limit_path(key),
        params=_scope(namespace),
        json=body,
        parse=records.flow_rule,
        replay_safe=True,
        subject="limit",
    )


def pause_key(
    key: str,
    *,
    until: datetime | None = None,
    note: str | None = None,
    namespace: str | None = None,
) -> Call[records.FlowRule]:
    body: dict[str, Any] = {"note": note}
    if until is not None:
        body["until"] = _time("until", until)
    # The same pause sent twice leaves the rule as once.
    return Call(
        method="POST",
        path=f"{_limit_path(key)}/pause",
        params=_scope(namespace),
        json=body,
        parse=records.flow_rule,
        replay_safe=True,
        subject="limit",
    )


def resume_key(key: str, *, namespace: str | None = None) -> Call[records.FlowRule]:
    # Not replayed: a replay of a resume that did happen would answer 404.
    return Call(
        method="POST",
        path=f"{_limit_path(key)}/resume",
        params=_scope(namespace),
        parse=records.flow_rule,
        subject="limit",
    )


def delete_limit(key: str, *, namespace: str | None = None) -> Call[records.FlowRule]:
    return Call(
        method="DELETE",
        path=_limit_path(key),
        params=_scope(namespace),
        parse=records.flow_rule,
        subject="limit",
    )


# --- bulk actions (/v1/bulk-actions) -----------------------------------------------------------

BulkActionName = Literal["cancel", "requeue", "reschedule"]


class BulkFilter(TypedDict, total=False):
    """Which jobs a bulk action changes: every condition given must hold."""

    state: str  # scheduled or waiting (cancel, reschedule); dead (requeue)
    routing_key: str  # exactly
    routing_key_prefix: str  # these words or below: billing matches billing.charge
    run_at_from: datetime
    run_at_to: datetime
    finished_from: datetime  # a dead job's end (requeue only)
    finished_to: datetime
    error_contains: str  # its last error contains this (any case)
    namespace: str  # an admin's key only ("" the default one)


def _bulk_body(
    action: BulkActionName,
    filter: BulkFilter | None,
    run_at: datetime | None,
    shift: Duration | None,
    *,
    dry_run: bool,
) -> dict[str, Any]:
    given: dict[str, Any] = dict(filter or {})
    for name in ("run_at_from", "run_at_to", "finished_from", "finished_to"):
        if name in given:
            given[name] = _time(name, given[name])
    body: dict[str, Any] = {"action": action, "filter": given, "dry_run": dry_run}
    if run_at is not None:
        body["run_at"] = _time("run_at", run_at)
    if shift is not None:
        body["shift_s"] = seconds("shift", shift)
    return body


def bulk_dry_run(
    action: BulkActionName,
    *,
    filter: BulkFilter | None = None,
    run_at: datetime | None = None,
    shift: Duration | None = None,
) -> Call[records.BulkDryRun]:
    return Call(
        method="POST",
        path=BULK_ACTIONS,
        json=_bulk_body(action, filter, run_at, shift, dry_run=True),
        parse=records.bulk_dry_run,
        replay_safe=True,  # changes nothing
        subject="bulk",
    )


def start_bulk_action(
    action: BulkActionName,
    *,
    filter: BulkFilter | None = None,
    run_at: datetime | None = None,
    shift: Duration | None = None,
) -> Call[records.BulkAction]:
    # Not replayed: a second action would be made (it would change only what the first missed).
    return Call(
        method="POST",
        path=BULK_ACTIONS,
        json=_bulk_body(action, filter, run_at, shift, dry_run=False),
        parse=records.bulk_action,
        subject="bulk",
    )


def _bulk_path(action_id: str) -> str:
    return f"{BULK_ACTIONS}/{quote(str(action_id), safe='')}"


def get_bulk_action(action_id: str) -> Call[records.BulkAction]:
    return Call(
        method="GET",
        path=_bulk_path(action_id),
        parse=records.bulk_action,
        replay_safe=True,
        subject="bulk",
    )


def bulk_actions(
    *, limit: int = 100, before: str | None = None
) -> Call[tuple[records.BulkAction, ...]]:
    params: dict[str, object] = {"limit": limit}
    if before is not None:
        params["before"] = before
    return Call(
        method="GET",
        path=BULK_ACTIONS,
        params=params,
        parse=records.bulk_actions,
        replay_safe=True,
        subject="bulk",
    )


def stop_bulk_action(action_id: str) -> Call[records.BulkAction]:
    # Not replayed: a replay of a stop that did happen would answer 409.
    return Call(
        method="POST",
        path=f"{_bulk_path(action_id)}/stop",
        parse=records.bulk_action,
        subject="bulk",
    )


def resume_bulk_action(action_id: str) -> Call[records.BulkAction]:
    return Call(
        method="POST",
        path=f"{_bulk_path(action_id)}/resume",
        parse=records.bulk_action,
        subject="bulk",
    )
