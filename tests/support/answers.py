"""The dispatcher's answers rendered by its own code (``api.schemas``, ``api.schedule_schemas``),
for tests of the SDK client that need no node: what the client parses is what the API sends."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from dispatcher import models
from dispatcher.api import schedule_schemas, schemas
from dispatcher.recurring import model
from dispatcher.recurring.occurrences import Timing

CREATED_AT = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def stored_job(**fields: Any) -> models.Job:
    values: dict[str, Any] = {
        "id": uuid.UUID("01890000-0000-7000-8000-000000000001"),
        "shard": 3,
        "state": models.JobState.SCHEDULED,
        "routing_key": "orders.expire",
        "payload": b'{"order":7}',
        "run_at": CREATED_AT + timedelta(minutes=30),
        "idempotency_key": "order-7-expiry",
        "headers": {"tenant": "acme"},
        "priority": 4,
        "ttl_ms": 60_000,
        "created_at": CREATED_AT,
        "updated_at": CREATED_AT,
        "dispatched_at": None,
        "publish_attempts": 0,
    }
    return models.Job(**{**values, **fields})


def stored_schedule(**fields: Any) -> model.Schedule:
    spec = model.ScheduleSpec(
        name="nightly",
        timing=Timing(
            cron="30 2 * * *", timezone="Europe/Paris", interval_s=None, start_at=CREATED_AT
        ),
        template=model.Template(routing_key="reports.nightly", payload=b"[1,2]", headers={}),
    )
    values: dict[str, Any] = {
        "id": 12,
        "namespace": "team-a",
        "spec": spec,
        "next_at": CREATED_AT + timedelta(hours=14, minutes=30),
        "last_fired_at": None,
        "created_at": CREATED_AT,
        "updated_at": CREATED_AT,
    }
    return model.Schedule(**{**values, **fields})


def answer(document: object, status: int = 200) -> httpx.Response:
    """The HTTP answer carrying ``document`` as the node encodes it."""
    return httpx.Response(status, content=bytes(schemas.json_response(document, status).body))


def job_answer(status: int = 200, **fields: Any) -> httpx.Response:
    outcome = models.Outcome.CREATED if status == 201 else models.Outcome.KEPT
    return answer(schemas.job_document(stored_job(**fields), outcome=outcome), status)


def history_answer(events: list[models.JobEvent]) -> httpx.Response:
    return answer(schemas.history_document(stored_job(), events))


def schedule_answer(upcoming: list[datetime] | None = None) -> httpx.Response:
    return answer(schedule_schemas.schedule_document(stored_schedule(), upcoming=upcoming))


def problem(status: int, error: str, message: str, **extra: Any) -> httpx.Response:
    return httpx.Response(status, json={"error": error, "message": message, **extra})
