"""Request and response models of /v1/schedules. The job template shares its field types and
rules with ``schemas.JobCreate``; the configurable limits are checked by ``schemas.to_spec``."""

from __future__ import annotations

import functools
import zoneinfo
from datetime import UTC, datetime
from typing import Annotated

import orjson
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictInt, field_validator

from consumers_sdk import schedule_rules
from dispatcher import errors
from dispatcher.api import schemas
from dispatcher.recurring import cron, model
from dispatcher.recurring.occurrences import MAX_TIME, MIN_TIME, Missed, rfc3339
from dispatcher.settings import Settings

Name = Annotated[
    str,
    Field(
        min_length=1,
        max_length=schedule_rules.MAX_NAME_LENGTH,
        pattern=schedule_rules.NAME_PATTERN,
    ),
]
MAX_INTERVAL_S = 366 * 86400
MAX_GRACE_S = 30 * 86400
TIME_RANGE = f"{rfc3339(MIN_TIME)} to {rfc3339(MAX_TIME)}"  # of start_at and end_at


class JobTemplate(BaseModel):
    """What each occurrence publishes: a job without its time and idempotency key."""

    model_config = ConfigDict(extra="forbid")

    routing_key: schemas.RoutingKey
    payload: schemas.Payload
    headers: schemas.Headers = Field(default_factory=dict)
    priority: schemas.Priority | None = None
    ttl_ms: schemas.TtlMs | None = None


def _valid_cron(value: str | None) -> str | None:
    if value is not None:
        cron.parse(value)  # CronError is a ValueError: 422 naming "cron"
    return value


@functools.cache
def _zones() -> frozenset[str]:
    # The tz database's names, not whatever file ZoneInfo would open: "localtime" is the host's
    # own zone (nodes could disagree), and files such as "zone.tab" are not zones at all.
    return frozenset(zoneinfo.available_timezones() - {"localtime"})


def _valid_zone(value: str) -> str:
    if value not in _zones():
        raise ValueError(f"unknown time zone {value!r} (an IANA name such as Asia/Shanghai)")
    return value


Interval = Annotated[StrictInt, Field(ge=1, le=MAX_INTERVAL_S, description="seconds")]
Grace = Annotated[float, Field(ge=0, le=MAX_GRACE_S)]
CRON_DOC = "five fields (minute hour day-of-month month day-of-week) in `timezone`"


class ScheduleCreate(BaseModel):
    """A recurring schedule: ``cron`` (in ``timezone``) or ``interval_s``, and the job to make."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="unique in the caller's namespace")
    cron: str | None = Field(None, max_length=200, description=CRON_DOC)
    timezone: str = Field(
        schedule_rules.DEFAULT_TIMEZONE,
        max_length=64,
        description="IANA zone of the cron expression",
    )
    interval_s: Interval | None = None
    job: JobTemplate
    start_at: AwareDatetime | None = Field(
        None, description="first occurrence at or after (default now); within " + TIME_RANGE
    )
    end_at: AwareDatetime | None = Field(
        None, description="last occurrence at or before; within " + TIME_RANGE
    )
    missed: Missed = Field(Missed.LATEST, description="occurrences missed during downtime")
    grace_s: Grace = Field(
        schedule_rules.DEFAULT_GRACE_S, description="an occurrence later than this is missed"
    )
    paused: bool = False

    _cron = field_validator("cron")(_valid_cron)
    _zone = field_validator("timezone")(_valid_zone)


class ScheduleUpdate(BaseModel):
    """Only the fields given change; ``"end_at": null`` removes the end, and switching between
    cron and interval sets the other one to null."""

    model_config = ConfigDict(extra="forbid")

    paused: bool | None = None
    cron: str | None = Field(None, max_length=200, description=CRON_DOC)
    timezone: str | None = Field(None, max_length=64)
    interval_s: Interval | None = None
    job: JobTemplate | None = None
    end_at: AwareDatetime | None = None
    missed: Missed | None = None
    grace_s: Grace | None = None

    _cron = field_validator("cron")(_valid_cron)

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        return None if value is None else _valid_zone(value)


class ScheduleOut(BaseModel):
    """A schedule as the API shows it (``schedule_document`` renders it)."""

    id: int
    name: str
    namespace: str | None
    cron: str | None
    timezone: str
    interval_s: int | None
    job: JobTemplate
    start_at: datetime
    end_at: datetime | None
    missed: Missed
    grace_s: float
    paused: bool
    next_at: datetime | None = Field(description="the next occurrence not yet made a job")
    last_fired_at: datetime | None = Field(description="the latest occurrence made a job")
    created_at: datetime
    updated_at: datetime
    error: str | None = Field(
        None, description="why the dispatcher paused it (it could not be planned); a resume clears"
    )
    upcoming: list[datetime] | None = Field(None, description="the next occurrences (GET one)")


class SchedulePage(BaseModel):
    schedules: list[ScheduleOut]
    next_after: int | None = Field(description="pass as `after` for the next page")


def to_template(
    job: JobTemplate, settings: Settings, *, now: datetime, field_prefix: str = "job."
) -> model.Template:
    """The template checked against the configured limits exactly as a job due now would be."""
    probe = schemas.JobCreate.model_construct(
        routing_key=job.routing_key,
        payload=job.payload,
        headers=job.headers,
        priority=job.priority,
        ttl_ms=job.ttl_ms,
        delay_ms=None,
        run_at=None,
        idempotency_key=None,
    )
    spec = schemas.to_spec(probe, settings, now=now, field_prefix=field_prefix)
    return model.Template(
        routing_key=spec.routing_key,
        payload=spec.payload,
        headers=spec.headers,
        priority=spec.priority,
        ttl_ms=spec.ttl_ms,
    )


def in_utc(moment: datetime | None, field: str) -> datetime | None:
    """A time in UTC; 422 naming the field outside ``MIN_TIME``-``MAX_TIME`` (the range every
    zone's wall clock, the occurrence search and PostgreSQL carry)."""
    if moment is None:
        return None
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not MIN_TIME <= utc <= MAX_TIME:
        raise errors.InvalidField(field, f"must be within {TIME_RANGE}")
    return utc


def schedule_document(
    schedule: model.Schedule, *, upcoming: list[datetime] | None = None
) -> dict[str, object]:
    spec = schedule.spec
    timing, template = spec.timing, spec.template
    document: dict[str, object] = {
        "id": schedule.id,
        "name": spec.name,
        "namespace": schedule.namespace,
        "cron": timing.cron,
        "timezone": timing.timezone,
        "interval_s": timing.interval_s,
        "job": {
            "routing_key": template.routing_key,
            "payload": orjson.Fragment(template.payload),
            "headers": dict(template.headers),
            "priority": template.priority,
            "ttl_ms": template.ttl_ms,
        },
        "start_at": timing.start_at,
        "end_at": timing.end_at,
        "missed": spec.missed.value,
        "grace_s": spec.grace_s,
        "paused": spec.paused,
        "next_at": schedule.next_at,
        "last_fired_at": schedule.last_fired_at,
        "created_at": schedule.created_at,
        "updated_at": schedule.updated_at,
        "error": schedule.error,
    }
    if upcoming is not None:
        document["upcoming"] = [rfc3339(moment) for moment in upcoming]
    return document
