"""Request and response models of /v1/bulk-actions (``bulk``): what a request may name, and the
action document. The checks beyond types are ``bulk.check_filter`` and ``bulk.check_change``, so
one place says what a filter may be and its 422 names the field."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool

from consumers_sdk import bulk_rules
from dispatcher.api.schemas import JobOut
from dispatcher.bulk import model as bulk


class FilterIn(BaseModel):
    """Which jobs: every condition given must hold (none: every job the action may change in the
    key's namespace and routing-key prefixes)."""

    model_config = ConfigDict(extra="forbid")

    state: str | None = Field(
        None, description="scheduled or waiting (cancel, reschedule), dead (requeue)"
    )
    routing_key: str | None = Field(None, max_length=255, description="this routing key exactly")
    routing_key_prefix: str | None = Field(
        None, max_length=255, description="these words or below: billing matches billing.charge"
    )
    run_at_from: AwareDatetime | None = None
    run_at_to: AwareDatetime | None = None
    finished_from: AwareDatetime | None = Field(
        None, description="a dead job's end (requeue only): its last change at or after this"
    )
    finished_to: AwareDatetime | None = None
    error_contains: str | None = Field(
        None, description="its last error contains this text (any case)"
    )
    namespace: str | None = Field(
        None, max_length=64, description="an admin's key only: one namespace ('' the default)"
    )


class BulkActionIn(BaseModel):
    """A bulk action: ``dry_run`` answers the count and a sample and changes nothing."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["cancel", "requeue", "reschedule"]
    filter: FilterIn = Field(default_factory=FilterIn)
    run_at: AwareDatetime | None = Field(None, description="a reschedule's new time for all")
    shift_s: float | None = Field(
        None, strict=True, description="a reschedule's move of each job's time, in seconds"
    )
    dry_run: StrictBool = False


class DryRunOut(BaseModel):
    action: str
    matched: int = Field(
        description="jobs the filter matches now (at least, when the count stopped)"
    )
    matched_at_least: bool = Field(
        description="the count stopped at DISPATCHER_BULK_COUNT_CAP: at least ``matched`` match"
    )
    sample: list[JobOut] = Field(description=f"the first {bulk_rules.SAMPLE_SIZE} of them, by id")


class BulkActionOut(BaseModel):
    id: uuid.UUID
    action: str
    status: str = Field(description="running, stopped, done or failed")
    reason: str | None = Field(None, description="why it failed")
    filter: dict[str, object]
    run_at: datetime | None = None
    shift_s: float | None = None
    touched: int = Field(description="jobs changed so far")
    matched_estimate: int = Field(description="jobs the filter matched when it was made")
    cursor: uuid.UUID = Field(description="every job up to this id was handled")
    created_by: str
    worked_by: str | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class BulkActionPage(BaseModel):
    bulk_actions: list[BulkActionOut]
    next_before: uuid.UUID | None = None


def filter_document(spec: bulk.Filter) -> dict[str, object]:
    return {name: value for name, value in bulk.filter_columns(spec).items() if value is not None}


def action_document(action: bulk.BulkAction) -> dict[str, object]:
    """An action in the shape of ``BulkActionOut``, ready for orjson."""
    return {
        "id": str(action.id),
        "action": action.action.value,
        "status": action.status.value,
        "reason": action.reason,
        "filter": filter_document(action.filter),
        "run_at": action.change.run_at,
        "shift_s": action.change.shift_s,
        "touched": action.touched,
        "matched_estimate": action.matched_estimate,
        "cursor": str(action.cursor),
        "created_by": action.created_by,
        "worked_by": action.worked_by,
        "created_at": action.created_at,
        "updated_at": action.updated_at,
        "finished_at": action.finished_at,
    }
