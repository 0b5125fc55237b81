"""What the client returns: frozen records of the API's answers (a job, its history, a page of
jobs, a recurring schedule, a page of schedules, a flow rule), parsed from their JSON.

Keys the API adds in a later release are ignored, so an older SDK keeps working against a newer
dispatcher. Times are timezone-aware ``datetime``s; ids are strings, as on a delivered ``Job``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from consumers_sdk import contract

Document = Mapping[str, Any]


def _at(value: Any) -> datetime:
    return datetime.fromisoformat(value)


def _maybe_at(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


class _ReadByKey:
    """``job["id"]`` as in the releases that returned dicts; deprecated for ``job.id``."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        warnings.warn(
            f'job["{key}"] is deprecated: the client returns records now, use job.{key}',
            DeprecationWarning,
            stacklevel=2,
        )
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryEntry:
    """One step of a job's life: ``scheduled``, ``dispatched``, ``cancelled``, ``expired``, the
    consumers' ``started``, ``failed``, ``succeeded``, ``dead``, and the dispatcher's changes:
    ``requeued``, ``replaced`` and ``extended`` (a submit of its idempotency key), each with its
    ``detail`` (``run_at ...``: the time it moved to)."""

    event: str
    at: datetime
    attempt: int | None = None
    group: str | None = None
    consumer: str | None = None
    error: str | None = None
    ignored: str | None = None  # why a consumer's event changed nothing
    detail: str | None = None  # what a change by the dispatcher did


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldBy:
    """The flow rule holding a scheduled job back (``client.limits``)."""

    key: str
    namespace: str | None  # None: the rule is for every namespace
    paused: bool = False  # the rule pauses its jobs (until ``paused_until``)
    paused_until: datetime | None = None
    metered: bool = False  # the rule lets its jobs go at its rate, within its jobs in flight
    note: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord(_ReadByKey):
    """A job as the dispatcher stores it. ``state`` is one of ``waiting``, ``scheduled``,
    ``dispatching``, ``dispatched``, ``succeeded``, ``dead``, ``cancelled``, ``expired``.
    ``created`` and ``outcome`` are set by ``schedule``/``schedule_many``: ``created``, or what
    became of the job the idempotency key names (``kept``, ``replaced``, ``extended``, or
    ``refused``: it was no longer pending, or had another routing key, and is answered unchanged).
    ``release_key`` says when the job lets go of its key (``never``, ``dispatched``,
    ``finished``), ``key_released`` whether it has. ``history``, ``after`` and ``pending`` are
    filled by ``get`` only."""

    id: str
    shard: int
    state: str
    routing_key: str
    payload: Any
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None
    idempotency_key: str | None
    headers: Mapping[str, contract.HeaderValue]
    priority: int | None
    ttl_ms: int | None
    publish_attempts: int
    namespace: str | None = None
    last_error: str | None = None
    created: bool | None = None
    history: tuple[HistoryEntry, ...] = ()
    after: tuple[str, ...] = ()  # the jobs it waits for
    pending: tuple[str, ...] = ()  # those of ``after`` that have not succeeded yet
    held_by: HeldBy | None = None  # the flow rule holding it back while it is due
    outcome: str | None = None
    release_key: str = "never"
    key_released: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPage:
    """One page of ``GET /v1/jobs``; pass ``next_after`` as ``after`` for the next (None: last)."""

    jobs: tuple[JobRecord, ...]
    next_after: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTemplate:
    """What each occurrence of a schedule publishes: a job without its time and key. Give
    ``dataclasses.replace(schedule.job, payload=...)`` to ``schedules.change(job=...)``."""

    routing_key: str
    payload: Any
    headers: Mapping[str, contract.HeaderValue]
    priority: int | None = None
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A recurring schedule: ``cron`` (in ``timezone``) or ``interval_s``. ``missed`` is ``all``,
    ``latest`` or ``skip``; ``error`` says why the dispatcher paused it; ``upcoming`` (the next
    occurrences) is filled by ``schedules.get`` only."""

    id: int
    name: str
    namespace: str | None
    cron: str | None
    timezone: str
    interval_s: int | None
    job: JobTemplate
    start_at: datetime
    end_at: datetime | None
    missed: str
    grace_s: float
    paused: bool
    next_at: datetime | None
    last_fired_at: datetime | None
    created_at: datetime
    updated_at: datetime
    error: str | None = None
    upcoming: tuple[datetime, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulePage:
    """One page of ``GET /v1/schedules``; ``next_after`` (None: last) goes on to the next."""

    schedules: tuple[Schedule, ...]
    next_after: int | None


def job(document: Document) -> JobRecord:
    return JobRecord(
        id=document["id"],
        shard=document["shard"],
        state=document["state"],
        routing_key=document["routing_key"],
        payload=document.get("payload"),
        run_at=_at(document["run_at"]),
        created_at=_at(document["created_at"]),
        updated_at=_at(document["updated_at"]),
        dispatched_at=_maybe_at(document.get("dispatched_at")),
        idempotency_key=document.get("idempotency_key"),
        headers=dict(document.get("headers") or {}),
        priority=document.get("priority"),
        ttl_ms=document.get("ttl_ms"),
        publish_attempts=document.get("publish_attempts", 0),
        namespace=document.get("namespace"),
        last_error=document.get("last_error"),
        created=document.get("created"),
        history=tuple(_entry(step) for step in document.get("history") or ()),
        after=tuple(document.get("after") or ()),
        pending=tuple(document.get("pending") or ()),
        held_by=_held_by(document.get("held_by")),
        outcome=_outcome(document),
        release_key=document.get("release_key") or "never",
        key_released=bool(document.get("key_released", False)),
    )


def _outcome(document: Document) -> str | None:
    """A submit's outcome; from a dispatcher older than outcomes, read from ``created`` (it could
    only keep the job a key named)."""
    created = document.get("created")
    if "outcome" in document or created is None:
        return document.get("outcome")
    return "created" if created else "kept"


def _entry(document: Document) -> HistoryEntry:
    return HistoryEntry(
        event=document["event"],
        at=_at(document["at"]),
        attempt=document.get("attempt"),
        group=document.get("group"),
        consumer=document.get("consumer"),
        error=document.get("error"),
        ignored=document.get("ignored"),
        detail=document.get("detail"),
    )


def jobs(document: Document) -> tuple[JobRecord, ...]:
    """The ``jobs`` of a batch's answer."""
    return tuple(job(item) for item in document["jobs"])


def job_page(document: Document) -> JobPage:
    return JobPage(jobs=jobs(document), next_after=document.get("next_after"))


def schedule(document: Document) -> Schedule:
    template = document["job"]
    return Schedule(
        id=document["id"],
        name=document["name"],
        namespace=document.get("namespace"),
        cron=document.get("cron"),
        timezone=document.get("timezone", "UTC"),
        interval_s=document.get("interval_s"),
        job=JobTemplate(
            routing_key=template["routing_key"],
            payload=template.get("payload"),
            headers=dict(template.get("headers") or {}),
            priority=template.get("priority"),
            ttl_ms=template.get("ttl_ms"),
        ),
        start_at=_at(document["start_at"]),
        end_at=_maybe_at(document.get("end_at")),
        missed=document["missed"],
        grace_s=document["grace_s"],
        paused=document["paused"],
        next_at=_maybe_at(document.get("next_at")),
        last_fired_at=_maybe_at(document.get("last_fired_at")),
        created_at=_at(document["created_at"]),
        updated_at=_at(document["updated_at"]),
        error=document.get("error"),
        upcoming=tuple(_at(moment) for moment in document.get("upcoming") or ()),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowRule:
    """A flow rule (``client.limits``): what the dispatcher holds back for ``key`` (a routing key
    and everything below it) in ``namespace`` (None: every namespace; "": the default one).
    ``holding``: whether it holds its jobs now (paused); ``metering``: whether its meter lets them
    go now (at most ``rate_per_s`` a second in bursts of ``burst``, at most ``max_in_flight`` not
    yet finished, a silent one's slot freed after ``in_flight_timeout_s``; None: no such limit).
    ``owner``: "operator" (an admin key set it last: a limits key may not change it) or
    "tenant" (its namespace's limits key set it). The meter's fields are None, ``metering`` False
    and ``owner`` None from a dispatcher older than them."""

    key: str
    namespace: str | None
    paused: bool
    paused_until: datetime | None
    note: str | None
    holding: bool
    updated_at: datetime
    rate_per_s: float | None = None
    burst: int | None = None
    max_in_flight: int | None = None
    in_flight_timeout_s: float | None = None
    metering: bool = False
    owner: str | None = None


def flow_rule(document: Document) -> FlowRule:
    return FlowRule(
        key=document["key"],
        namespace=document.get("namespace"),
        paused=document["paused"],
        paused_until=_maybe_at(document.get("paused_until")),
        note=document.get("note"),
        holding=document["holding"],
        updated_at=_at(document["updated_at"]),
        rate_per_s=document.get("rate_per_s"),
        burst=document.get("burst"),
        max_in_flight=document.get("max_in_flight"),
        in_flight_timeout_s=document.get("in_flight_timeout_s"),
        metering=document.get("metering", False),
        owner=document.get("owner"),
    )


def flow_rules(document: Document) -> tuple[FlowRule, ...]:
    return tuple(flow_rule(rule) for rule in document["limits"])


def _held_by(document: Document | None) -> HeldBy | None:
    if not document:
        return None
    return HeldBy(
        key=document["key"],
        namespace=document.get("namespace"),
        paused=bool(document.get("paused", False)),
        paused_until=_maybe_at(document.get("paused_until")),
        metered=bool(document.get("metered", False)),
        note=document.get("note"),
    )


def schedule_page(document: Document) -> SchedulePage:
    return SchedulePage(
        schedules=tuple(schedule(item) for item in document["schedules"]),
        next_after=document.get("next_after"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkAction:
    """A bulk action (``client.bulk``) and its progress: ``status`` running, stopped, done or
    failed (``reason``); ``touched`` jobs changed so far of the ``matched_estimate`` the filter
    matched when it was made."""

    id: str
    action: str
    status: str
    reason: str | None
    filter: Mapping[str, Any]
    run_at: datetime | None
    shift_s: float | None
    touched: int
    matched_estimate: int
    created_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def running(self) -> bool:
        return self.status == "running"


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkDryRun:
    """What a bulk action would change now: how many jobs (at least, with ``matched_at_least``:
    the node's count stops at its cap), and the first of them."""

    action: str
    matched: int
    sample: tuple[JobRecord, ...]
    matched_at_least: bool = False


def bulk_action(document: Document) -> BulkAction:
    return BulkAction(
        id=document["id"],
        action=document["action"],
        status=document["status"],
        reason=document.get("reason"),
        filter=document.get("filter") or {},
        run_at=_maybe_at(document.get("run_at")),
        shift_s=document.get("shift_s"),
        touched=document["touched"],
        matched_estimate=document["matched_estimate"],
        created_by=document["created_by"],
        created_at=_at(document["created_at"]),
        updated_at=_at(document["updated_at"]),
        finished_at=_maybe_at(document.get("finished_at")),
    )


def bulk_actions(document: Document) -> tuple[BulkAction, ...]:
    return tuple(bulk_action(action) for action in document["bulk_actions"])


def bulk_dry_run(document: Document) -> BulkDryRun:
    return BulkDryRun(
        action=document["action"],
        matched=document["matched"],
        sample=tuple(job(found) for found in document["sample"]),
        matched_at_least=bool(document.get("matched_at_least", False)),
    )
