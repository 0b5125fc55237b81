"""A stored schedule, and the job each of its occurrences becomes. Frozen; no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from consumers_sdk import schedule_rules
from dispatcher import models
from dispatcher.recurring.occurrences import Missed, Timing, idempotency_key


@dataclass(frozen=True, slots=True, kw_only=True)
class Template:
    """What each occurrence publishes: a job without its time and key."""

    routing_key: str
    payload: bytes  # the JSON body exactly as published
    headers: Mapping[str, models.HeaderValue]
    priority: int | None = None
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A schedule as its owner defines it (what POST and PATCH set)."""

    name: str
    timing: Timing
    template: Template
    missed: Missed = Missed.LATEST  # schedule_rules.DEFAULT_MISSED (a unit test holds them equal)
    grace_s: float = schedule_rules.DEFAULT_GRACE_S
    paused: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A stored schedule. ``next_at`` is the next occurrence not yet turned into a job (None once
    the schedule has ended); ``last_fired_at`` the latest one that was; ``error`` why the
    materialiser paused it (it could not be planned), until it is resumed."""

    id: int
    namespace: str | None
    spec: ScheduleSpec
    next_at: datetime | None
    last_fired_at: datetime | None
    created_at: datetime
    updated_at: datetime
    error: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def job(self, occurrence: datetime) -> models.JobSpec:
        """The job of one occurrence: due at it, keyed by the schedule's name and it."""
        template = self.spec.template
        return models.JobSpec(
            routing_key=template.routing_key,
            payload=template.payload,
            run_at=occurrence,
            idempotency_key=idempotency_key(self.spec.name, occurrence),
            headers=template.headers,
            priority=template.priority,
            ttl_ms=template.ttl_ms,
        )
