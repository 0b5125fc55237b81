"""Bulk actions (pure): what an action changes, the filter it matches jobs by, and the checks a
request passes before anything is stored.

An action's life, in ``bulk_actions.status`` (worked by ``bulk_runner``):

    running --batches until no job is left--> done
    running --stop--> stopped --resume--> running (from its cursor: nothing is changed twice)
    running --a batch keeps failing on its jobs, or takes too long--> failed (with the reason)
    done | failed | stopped --``Bounds.keep_s`` after its last change--> removed

Many tenants share the runners (``Bounds``): each namespace has at most ``max_running`` running
and ``max_stored`` stored actions, an operator's (made with an admin key) in a budget of their
own; runners work one batch at a time, an operator's action first, then the namespace whose
last batch is the oldest, then its least recently worked action: a tenant's eight actions take
one turn between them, and an operator's one-job cancel waits for one batch at most.

A job is matched by the filter when a batch reaches it (in id order, after the cursor), not when
the action is made: one that no longer matches is left alone. Each action changes only the
states it can change one job at a time (``bulk_rules.APPLIES_TO``), so a job already dispatching
or done is never cancelled or moved, as ``DELETE`` and ``PATCH /v1/jobs/{id}`` answer 409 for it.

The rules the SDK's in-memory fake applies too (the states, the checks of a request, the sample
and the history detail) live in ``consumers_sdk.bulk_rules``, which both import.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Unpack

from consumers_sdk import bulk_rules
from dispatcher import errors


class Action(enum.StrEnum):
    CANCEL = "cancel"
    REQUEUE = "requeue"
    RESCHEDULE = "reschedule"


class Status(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Filter:
    """Which jobs an action changes; None matches anything. ``namespace`` and ``scope_prefixes``
    come from the key that made the action (None: an admin's, every namespace or routing key)."""

    namespace: str | None
    states: tuple[str, ...]
    routing_key: str | None = None
    routing_key_prefix: str | None = None  # words: billing matches billing and billing.charge
    run_at_from: datetime | None = None
    run_at_to: datetime | None = None
    finished_from: datetime | None = None  # a finished job's updated_at
    finished_to: datetime | None = None
    error_contains: str | None = None
    scope_prefixes: tuple[str, ...] | None = None


def filter_columns(spec: Filter) -> dict[str, object]:
    """The filter's fields by name, its tuples as lists: the columns ``bulk_actions`` stores it
    in, and the ``filter`` the API shows (without its empty conditions)."""
    return {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in asdict(spec).items()
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """A reschedule's new time: ``run_at`` for every job, or each job's own moved by ``shift_s``."""

    run_at: datetime | None = None
    shift_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkAction:
    """A stored action with its progress."""

    id: uuid.UUID
    action: Action
    filter: Filter
    change: Change
    status: Status
    reason: str | None
    cursor: uuid.UUID
    touched: int
    matched_estimate: int
    created_by: str
    worked_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """What one tenant may take of the store and the runners (the ``DISPATCHER_BULK_*``
    settings of the same names)."""

    count_cap: int = 10_000  # a count stops here: "at least" this many
    read_timeout_s: float = 5.0  # a dry run's count and sample
    batch_timeout_s: float = 30.0  # one batch; past it the action fails
    reads: int = 1  # counts at once on a node; more are answered 429 (``read_gate``)
    read_duty: float = 0.25  # share of a counting slot's time spent counting
    reads_per_s: float = 10.0  # counts a node starts a second
    max_running: int = 4  # per namespace, an operator's apart
    max_stored: int = 100
    keep_s: float = 7 * 86_400.0  # a finished or stopped action, after its last change


@dataclass(frozen=True, slots=True, kw_only=True)
class Count:
    """How many jobs a filter matches: exactly ``matched``, or at least (the count stopped)."""

    matched: int
    at_least: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """What one batch did: how many jobs it looked at and changed, and whether it was the last."""

    seen: int
    changed: int
    done: bool
    due_at: datetime | None = None  # a requeue's: when the jobs it changed are due


def check_filter(
    action: Action,
    *,
    namespace: str | None,
    scope_prefixes: tuple[str, ...] | None,
    **asked: Unpack[bulk_rules.Asked],
) -> Filter:
    """The filter of a request, or InvalidField naming the field (``filter.<name>``)."""
    try:
        conditions = bulk_rules.check_conditions(action, **asked)
    except bulk_rules.Refused as refused:
        raise errors.InvalidField(refused.field, refused.problem) from None
    return Filter(namespace=namespace, scope_prefixes=scope_prefixes, **asdict(conditions))


def check_change(
    action: Action,
    *,
    run_at: datetime | None,
    shift_s: float | None,
    now: datetime,
    max_delay_days: int,
) -> Change:
    """A reschedule's ``run_at`` or ``shift_s`` (exactly one); none for the other actions."""
    try:
        due, shift = bulk_rules.check_change(
            action, run_at=run_at, shift_s=shift_s, now=now, max_delay_days=max_delay_days
        )
    except bulk_rules.Refused as refused:
        raise errors.InvalidField(refused.field, refused.problem) from None
    return Change(run_at=due, shift_s=shift)
