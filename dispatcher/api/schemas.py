"""Request and response models. Their constraints are the validation rules of the API; limits that
the configuration can change are checked by ``check_limits`` against the same field names."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated

import orjson
from fastapi import Response
from fastapi.exceptions import RequestValidationError
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from consumers_sdk import contract, validation
from dispatcher import errors, models
from dispatcher.dependencies import plan as dependency_plan
from dispatcher.flow.rules import Rule
from dispatcher.settings import Settings

# Defined once in the SDK, which ``enqueue`` validates with too.
ROUTING_KEY = validation.ROUTING_KEY
AMQP_SHORTSTR_BYTES = validation.AMQP_SHORTSTR_BYTES
INT64_MAX = validation.INT64_MAX

HeaderValue = StrictStr | StrictBool | StrictInt | StrictFloat


def _routing_key_words(value: str) -> str:
    if problem := validation.routing_key_problem(value):
        raise ValueError(problem)
    return value


def _header_name(name: str) -> str:
    # A key's error is located at (..., "headers", name, "[key]"): answered as headers.<name>.
    if problem := validation.header_name_problem(name):
        raise ValueError(problem)
    return name


# The fields a job and a schedule's job template share, with their rules.
RoutingKey = Annotated[
    StrictStr,
    Field(min_length=1, max_length=AMQP_SHORTSTR_BYTES),
    AfterValidator(_routing_key_words),
]
Payload = Annotated[JsonValue, Field(description="any JSON value; published as the message body")]
HeaderName = Annotated[StrictStr, AfterValidator(_header_name)]
Headers = dict[HeaderName, HeaderValue]
Priority = Annotated[StrictInt, Field(ge=0, le=validation.MAX_PRIORITY)]
TtlMs = Annotated[StrictInt, Field(ge=1, le=validation.MAX_TTL_MS)]


class JobCreate(BaseModel):
    """A job to schedule. Give ``delay_ms`` or ``run_at`` (or neither: due now)."""

    model_config = ConfigDict(extra="forbid")

    routing_key: RoutingKey
    payload: Payload
    delay_ms: Annotated[StrictInt, Field(ge=0)] | None = Field(
        None,
        description="due this long after the request, by PostgreSQL's clock (the one jobs fire "
        "on; never the node's host clock)",
    )
    run_at: AwareDatetime | None = Field(
        None, description="RFC 3339 with offset; in the past means as soon as possible"
    )
    idempotency_key: Annotated[StrictStr, Field(min_length=1, max_length=255)] | None = None
    on_existing: models.OnExisting = Field(
        models.OnExisting.KEEP,
        description="what an idempotency_key that names a job already does: keep (answer that "
        "job, unchanged), replace (the pending job takes this run_at, payload, headers, priority "
        "and ttl_ms), extend (the pending job moves to this run_at if that is later, never "
        "earlier: a debounce). A job being dispatched or done is never changed (outcome "
        "refused). Needs idempotency_key",
    )
    release_key: models.KeyRelease = Field(
        models.KeyRelease.NEVER,
        description="when the job lets go of its idempotency_key, so that the next submit of "
        "the key creates a new job: never (while it is stored), dispatched (once handed to "
        "RabbitMQ, or ended otherwise), finished (once succeeded, dead, cancelled or expired). "
        "Needs idempotency_key",
    )
    headers: Headers = Field(default_factory=dict)
    priority: Priority | None = None
    ttl_ms: TtlMs | None = Field(
        None, description="expire the job if it cannot be dispatched by run_at + ttl_ms"
    )
    after: list[uuid.UUID] = Field(
        default_factory=list,
        max_length=dependency_plan.MAX_AFTER,
        description="ids of jobs (in this namespace) that must succeed first; the job waits",
    )
    max_attempts: Annotated[StrictInt, Field(ge=1, le=contract.MAX_ATTEMPTS_LIMIT)] | None = Field(
        None, description="deliveries before the job is dead (over the consumer's default)"
    )
    retry_backoff_s: (
        Annotated[
            list[Annotated[StrictFloat, Field(ge=0, le=contract.RETRY_BACKOFF_MAX_S)]],
            Field(min_length=1, max_length=contract.RETRY_BACKOFF_MAX_STEPS),
        ]
        | None
    ) = Field(
        None,
        description="seconds to wait after each failed attempt, the last repeated (over the "
        "consumer's default backoff; rounded up to its delay tiers)",
    )

    @field_validator("run_at")
    @classmethod
    def _not_with_delay(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        if value is not None and info.data.get("delay_ms") is not None:
            raise ValueError("give delay_ms or run_at, not both")
        return value


class JobPatch(BaseModel):
    """A new time (``delay_ms`` from now or ``run_at``), payload or priority for a job that has
    not fired yet. Fields left out are kept; ``priority: null`` removes the priority."""

    model_config = ConfigDict(extra="forbid")

    delay_ms: Annotated[StrictInt, Field(ge=0)] | None = None
    run_at: AwareDatetime | None = Field(
        None, description="RFC 3339 with offset; in the past means as soon as possible"
    )
    payload: JsonValue = Field(None, description="any JSON value; replaces the payload")
    priority: Priority | None = None

    @field_validator("run_at")
    @classmethod
    def _not_with_delay(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        return JobCreate._not_with_delay(value, info)


class JobBatchCreate(BaseModel):
    """Up to ``max_batch`` jobs, stored all or nothing."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[JobCreate] = Field(min_length=1)


def batch_from_json(body: bytes) -> JobBatchCreate:
    """A batch validated straight from its JSON text by pydantic-core: decoding it into Python
    objects first and validating those took twice the CPU (py-spy). Refusals are raised as FastAPI
    raises them (locations under ``body``), so they answer alike."""
    try:
        return JobBatchCreate.model_validate_json(body)
    except ValidationError as exc:
        if not any(error["type"] == "json_invalid" for error in exc.errors()):
            raise _under_body(exc) from None
    # pydantic-core refuses some text that Python's decoder takes (a lone surrogate escape, NaN):
    # decoded as FastAPI decodes, the same body gets the same answer (a 422 naming the field).
    try:
        decoded = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        where = ("body", getattr(exc, "pos", 0))
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": where, "msg": "JSON decode error", "input": {}}]
        ) from None
    try:
        return JobBatchCreate.model_validate(decoded)
    except ValidationError as exc:
        raise _under_body(exc) from None


def _under_body(exc: ValidationError) -> RequestValidationError:
    return RequestValidationError(
        [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
    )


BATCH_REQUEST_BODY: dict[str, object] = {
    # The batch route reads its body itself (``batch_from_json``): documented here instead.
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    key: value
                    for key, value in JobBatchCreate.model_json_schema(
                        ref_template="#/components/schemas/{model}"
                    ).items()
                    if key != "$defs"  # JobCreate is a component already (the single POST)
                }
            }
        },
    }
}


class HeldBy(BaseModel):
    """The flow rule holding a scheduled job back (``/v1/limits``)."""

    key: str
    namespace: str | None = Field(description="null: the rule is for every namespace")
    paused: bool = Field(False, description="the rule pauses its jobs (until paused_until)")
    paused_until: datetime | None
    metered: bool = Field(
        False, description="the rule lets its jobs go at its rate and within its jobs in flight"
    )
    note: str | None


class JobOut(BaseModel):
    """A job as the API shows it. Documents the shape; ``job_document`` renders it."""

    id: uuid.UUID
    shard: int
    state: models.JobState
    routing_key: str
    payload: JsonValue
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None
    idempotency_key: str | None
    headers: dict[str, HeaderValue]
    priority: int | None
    ttl_ms: int | None
    publish_attempts: int
    namespace: str | None = None
    last_error: str | None = Field(None, description="a dead job's error, from its consumer")
    release_key: models.KeyRelease = Field(
        models.KeyRelease.NEVER, description="when it lets go of its idempotency_key"
    )
    key_released: bool = Field(
        False, description="it let go of its idempotency_key: the next submit of it created a job"
    )
    held_by: HeldBy | None = Field(
        None, description="the flow rule holding the job back while it is due (scheduled only)"
    )


class HistoryEntry(BaseModel):
    """One step of a job's life: ``scheduled``, ``dispatched``, ``cancelled``, ``expired`` (from
    the job's own timestamps), the consumers' ``started``, ``failed``, ``succeeded``, ``dead``,
    and the dispatcher's changes: ``requeued``, ``replaced`` and ``extended`` (a submit of its
    idempotency key), ``rescheduled`` and ``cancelled`` by a bulk action."""

    event: str
    at: datetime
    attempt: int | None = None
    group: str | None = None
    consumer: str | None = None
    error: str | None = None
    ignored: str | None = Field(
        None,
        description="why a consumer's event changed nothing: other_round (an earlier dispatch, "
        "or a guessed round), no_round, routing_key (another than the job's); with "
        "DISPATCHER_EVENT_USERS, no_user (no AMQP user_id) or publisher (its user may not "
        "report on this job)",
    )
    detail: str | None = Field(
        None, description="what a change by the dispatcher did: the new run_at, the bulk action"
    )


class JobWithHistory(JobOut):
    history: list[HistoryEntry]
    ignored_dropped: int = Field(
        0, description="ignored events counted but not kept (the history keeps the first 5)"
    )
    events_omitted: int = Field(
        0,
        description="older events consumers reported, left out of `history` (it shows the newest"
        " DISPATCHER_MAX_HISTORY_EVENTS)",
    )
    after: list[uuid.UUID] = Field(default_factory=list, description="the jobs it waits for")
    pending: list[uuid.UUID] = Field(
        default_factory=list, description="those of `after` that have not succeeded yet"
    )


class JobSubmitted(JobOut):
    created: bool = Field(description="false when the idempotency key found an existing job")
    outcome: models.Outcome = Field(
        description="created; or what became of the job the idempotency key names: kept "
        "(unchanged), replaced, extended, refused (replace or extend asked, and the job is "
        "dispatching or done, or has another routing key)"
    )


class BatchOut(BaseModel):
    jobs: list[JobSubmitted]


class JobPage(BaseModel):
    jobs: list[JobOut]
    next_after: uuid.UUID | None = Field(description="pass as `after` for the next page")


class Problem(BaseModel):
    """Every error answer."""

    error: str
    message: str
    fields: list[dict[str, str]] = Field(default_factory=list)
    state: str | None = None


def job_document(
    job: models.Job, *, outcome: models.Outcome | None = None, held_by: Rule | None = None
) -> dict[str, object]:
    """A job in the shape of ``JobOut`` (``JobSubmitted`` with ``outcome``), ready for orjson.

    Rendered without pydantic: on the submit path, building and serialising response models cost
    more than validating the request (py-spy). The payload is embedded as the stored JSON text. A
    property test holds the JSON equal to pydantic's rendering of the model for any job.
    """
    document: dict[str, object] = {
        "id": str(job.id),  # asyncpg's own UUID type is not one orjson knows
        "shard": job.shard,
        "state": job.state,
        "routing_key": job.routing_key,
        "payload": orjson.Fragment(job.payload),
        "run_at": job.run_at,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "dispatched_at": job.dispatched_at,
        "idempotency_key": job.idempotency_key,
        "headers": dict(job.headers),
        "priority": job.priority,
        "ttl_ms": job.ttl_ms,
        "publish_attempts": job.publish_attempts,
        "namespace": job.namespace,
        "last_error": job.last_error,
        "release_key": job.release_key,
        "key_released": job.key_released,
        "held_by": None
        if held_by is None
        else {
            "key": held_by.key,
            "namespace": held_by.namespace,
            "paused": held_by.limits.paused,
            "paused_until": held_by.limits.paused_until,
            "metered": held_by.limits.meters,
            "note": held_by.limits.note,
        },
    }
    if outcome is not None:
        document["created"] = outcome is models.Outcome.CREATED
        document["outcome"] = outcome
    return document


def history_document(
    job: models.Job,
    events: Sequence[models.JobEvent],
    *,
    ignored_dropped: int = 0,
    events_omitted: int = 0,
    held_by: Rule | None = None,
) -> dict[str, object]:
    """``job_document`` plus ``history`` (``JobWithHistory``), oldest first, and
    ``ignored_dropped``.

    The dispatcher's own steps come from the row's timestamps (so the hot paths write no event
    rows), plus a ``dispatched`` event kept by each requeue for the dispatch it replaced. A job is
    marked dispatched after RabbitMQ's confirm, which may come after a fast consumer's first
    event, so each ``dispatched`` is placed by meaning, right after the ``scheduled`` or
    ``requeued`` step it follows, not by its time.
    """
    rounds: list[list[dict[str, object]]] = [[{"event": "scheduled", "at": job.created_at}]]
    dispatches: list[dict[str, object]] = []
    for event in events:
        step: dict[str, object] = {
            "event": event.outcome,
            "at": event.at,
            "attempt": event.attempt,
            "group": event.group,
            "consumer": event.consumer,
            "error": event.error,
            "ignored": event.ignored,
            "detail": event.detail,
        }
        if event.outcome == "dispatched":
            dispatches.append({"event": "dispatched", "at": event.at})
        elif event.outcome == "requeued":
            rounds.append([step])
        else:
            rounds[-1].append(step)
    if job.dispatched_at is not None:
        dispatches.append({"event": "dispatched", "at": job.dispatched_at})
    for round_steps, dispatch in zip(rounds, dispatches, strict=False):
        # After the changes made while it waited (replaced, extended...), before what its
        # consumers reported.
        reported = (i for i, s in enumerate(round_steps) if s["event"] in contract.OUTCOMES)
        round_steps.insert(next(reported, len(round_steps)), dispatch)
    steps = [step for round_steps in rounds for step in round_steps]
    ended = job.state in (models.JobState.CANCELLED, models.JobState.EXPIRED)
    if ended and not any(step["event"] == job.state.value for step in rounds[-1]):
        steps.append({"event": job.state.value, "at": job.updated_at})
    document = job_document(job, held_by=held_by)
    document["history"] = steps
    document["ignored_dropped"] = ignored_dropped
    document["events_omitted"] = events_omitted
    return document


def json_response(content: object, status_code: int = 200) -> Response:
    return Response(
        orjson.dumps(content, option=orjson.OPT_UTC_Z),
        status_code=status_code,
        media_type="application/json",
    )


def check_headers(
    headers: dict[str, HeaderValue], settings: Settings, field_prefix: str = ""
) -> None:
    """The configured header limits, and values PostgreSQL and AMQP can hold."""
    found = validation.headers_problem(headers, settings.limits())
    if found is not None:
        field, problem = found
        raise errors.InvalidField(f"{field_prefix}{field}", problem)


def to_spec(
    job: JobCreate, settings: Settings, *, now: datetime, field_prefix: str = ""
) -> models.JobSpec:
    """Check the configurable limits and turn a request into what the intake stores."""
    payload = _encoded_payload(job.payload, settings, f"{field_prefix}payload")
    if len(job.routing_key.encode()) > settings.max_routing_key_bytes:
        raise errors.InvalidField(
            f"{field_prefix}routing_key", f"must be at most {settings.max_routing_key_bytes} bytes"
        )
    check_headers(job.headers, settings, field_prefix)
    if twice := dependency_plan.repeated(job.after):
        raise errors.InvalidField(f"{field_prefix}after[{twice[0]}]", f"repeats after[{twice[1]}]")
    if job.idempotency_key is not None and (
        problem := validation.idempotency_key_problem(job.idempotency_key, settings.limits())
    ):
        raise errors.InvalidField(f"{field_prefix}idempotency_key", problem)
    if levers := validation.key_levers_problem(
        job.idempotency_key, job.on_existing.value, job.release_key.value
    ):
        raise errors.InvalidField(f"{field_prefix}{levers[0]}", levers[1])
    return models.JobSpec(
        routing_key=job.routing_key,
        payload=payload,
        run_at=_run_at(job.run_at, job.delay_ms, settings, now=now, field_prefix=field_prefix),
        idempotency_key=job.idempotency_key,
        headers={
            **job.headers,
            **contract.retry_policy_headers(
                max_attempts=job.max_attempts, backoff_s=job.retry_backoff_s
            ),
        },
        priority=job.priority,
        ttl_ms=job.ttl_ms,
        after=tuple(job.after),
        on_existing=job.on_existing,
        release_key=job.release_key,
    )


def to_change(patch: JobPatch, settings: Settings, *, now: datetime) -> models.JobChange:
    """Check a reschedule against the configurable limits; only the fields sent change."""
    sent = patch.model_fields_set
    if not sent:
        raise errors.InvalidField("body", "give run_at, delay_ms, payload or priority to change")
    run_at = None
    if "run_at" in sent or "delay_ms" in sent:
        if patch.run_at is None and patch.delay_ms is None:
            raise errors.InvalidField("run_at", "must not be null")
        run_at = _run_at(patch.run_at, patch.delay_ms, settings, now=now)
    return models.JobChange(
        run_at=run_at,
        payload=_encoded_payload(patch.payload, settings, "payload") if "payload" in sent else None,
        set_priority="priority" in sent,
        priority=patch.priority,
    )


def _encoded_payload(payload: JsonValue, settings: Settings, field: str) -> bytes:
    try:
        encoded = orjson.dumps(payload)
    except TypeError as exc:  # an integer past 64 bits, a lone surrogate
        raise errors.InvalidField(field, f"cannot be encoded: {exc}") from None
    if len(encoded) > settings.max_payload_bytes:
        raise errors.PayloadTooLarge(field, len(encoded), settings.max_payload_bytes)
    return encoded


def _run_at(
    run_at: datetime | None,
    delay_ms: int | None,
    settings: Settings,
    *,
    now: datetime,
    field_prefix: str = "",
) -> datetime:
    """When a job given ``run_at`` or ``delay_ms`` (or neither: now) is due, in UTC."""
    field = "run_at" if run_at is not None else "delay_ms"
    try:  # a year past 9999 (or before 1) once in UTC cannot be stored
        due = (
            run_at.astimezone(UTC)
            if run_at is not None
            else now + timedelta(milliseconds=delay_ms or 0)
        )
    except OverflowError:
        raise errors.InvalidField(f"{field_prefix}{field}", "out of range") from None
    if problem := validation.due_problem(due, now, settings.limits()):
        raise errors.InvalidField(f"{field_prefix}{field}", problem)
    return due
