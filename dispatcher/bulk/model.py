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
states it can change one job at a time (``APPLIES_TO``), so a job already dispatching or done is
never cancelled or moved, as ``DELETE`` and ``PATCH /v1/jobs/{id}`` answer 409 for it.
"""

from __future__ import annotations

import enum
import math
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Final

from consumers_sdk import validation
from dispatcher import errors

MAX_ERROR_TEXT = 1000  # characters of ``error_contains``
SAMPLE_SIZE: Final = 20  # jobs a dry run shows


class Action(enum.StrEnum):
    CANCEL = "cancel"
    REQUEUE = "requeue"
    RESCHEDULE = "reschedule"


class Status(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    DONE = "done"
    FAILED = "failed"


# The states each action changes: those its one-job route accepts.
APPLIES_TO: Final = {
    Action.CANCEL: ("scheduled", "waiting"),
    Action.RESCHEDULE: ("scheduled", "waiting"),
    Action.REQUEUE: ("dead",),
}


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


def detail(action_id: uuid.UUID, action: Action) -> str:
    """What a changed job's history step says about the action that changed it."""
    return f"bulk action {action_id}: {action.value}"


def check_filter(
    action: Action,
    *,
    namespace: str | None,
    scope_prefixes: tuple[str, ...] | None,
    state: str | None = None,
    routing_key: str | None = None,
    routing_key_prefix: str | None = None,
    run_at_from: datetime | None = None,
    run_at_to: datetime | None = None,
    finished_from: datetime | None = None,
    finished_to: datetime | None = None,
    error_contains: str | None = None,
) -> Filter:
    """The filter of a request, or InvalidField naming the field (``filter.<name>``)."""
    states = APPLIES_TO[action]
    if state is not None:
        if state not in states:
            allowed = " or ".join(states)
            raise errors.InvalidField("filter.state", f"a {action.value} changes {allowed} jobs")
        states = (state,)
    if routing_key is not None and (
        problem := validation.routing_key_problem(routing_key.rstrip("."))
    ):
        raise errors.InvalidField("filter.routing_key", problem)
    prefix: str | None = None
    if routing_key_prefix is not None:
        prefix, problem = validation.prefix_words(routing_key_prefix)
        if problem:
            raise errors.InvalidField("filter.routing_key_prefix", problem)
    run_at_from, run_at_to = _check_range("run_at", run_at_from, run_at_to)
    finished_from, finished_to = _check_range("finished", finished_from, finished_to)
    if (finished_from or finished_to) and action is not Action.REQUEUE:
        raise errors.InvalidField(
            "filter.finished_from" if finished_from else "filter.finished_to",
            "only finished (dead) jobs have one: use it with requeue",
        )
    if error_contains is not None and not 0 < len(error_contains) <= MAX_ERROR_TEXT:
        raise errors.InvalidField("filter.error_contains", f"1 to {MAX_ERROR_TEXT} characters")
    if error_contains is not None and "\x00" in error_contains:
        raise errors.InvalidField("filter.error_contains", "must not contain NUL")
    return Filter(
        namespace=namespace,
        states=states,
        routing_key=routing_key,
        routing_key_prefix=prefix,
        run_at_from=run_at_from,
        run_at_to=run_at_to,
        finished_from=finished_from,
        finished_to=finished_to,
        error_contains=error_contains,
        scope_prefixes=scope_prefixes,
    )


def _check_range(
    name: str, start: datetime | None, end: datetime | None
) -> tuple[datetime | None, datetime | None]:
    """The range in UTC, or InvalidField naming the bound at fault."""
    start = _utc(f"filter.{name}_from", start)
    end = _utc(f"filter.{name}_to", end)
    if start is not None and end is not None and end < start:
        raise errors.InvalidField(f"filter.{name}_to", f"must not be before {name}_from")
    return start, end


def _utc(field: str, value: datetime | None) -> datetime | None:
    """An instant in UTC; a naive one, or one that UTC cannot hold (year 1 at +01:00), refused."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise errors.InvalidField(field, "must have a timezone")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise errors.InvalidField(field, "out of range") from None


def check_change(
    action: Action,
    *,
    run_at: datetime | None,
    shift_s: float | None,
    now: datetime,
    max_delay_days: int,
) -> Change:
    """A reschedule's ``run_at`` or ``shift_s`` (exactly one); none for the other actions."""
    if action is not Action.RESCHEDULE:
        for field, value in (("run_at", run_at), ("shift_s", shift_s)):
            if value is not None:
                raise errors.InvalidField(field, f"only a reschedule takes {field}")
        return Change()
    if (run_at is None) == (shift_s is None):
        raise errors.InvalidField("run_at", "a reschedule takes either run_at or shift_s")
    if shift_s is not None:
        if not math.isfinite(shift_s) or shift_s == 0:
            raise errors.InvalidField("shift_s", "a number of seconds other than 0")
        if abs(shift_s) > max_delay_days * 86400:
            raise errors.InvalidField("shift_s", f"at most {max_delay_days} days either way")
        return Change(shift_s=shift_s)
    due = _utc("run_at", run_at)
    assert due is not None
    limits = validation.Limits(max_delay_days=max_delay_days)
    if problem := validation.due_problem(due, now, limits):
        raise errors.InvalidField("run_at", problem)
    return Change(run_at=due)
