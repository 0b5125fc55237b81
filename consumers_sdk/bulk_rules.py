"""Bulk actions' rules, defined once for the dispatcher (``dispatcher.bulk.model``) and the SDK's
in-memory fake (``testing.memory_bulk``): what each action changes, the checks of a request's
filter and change, the size of a dry run's sample and what a changed job's history says. Pure.

A check normalises what it checks (a prefix's words, an instant in UTC), so it returns the
checked value and raises ``Refused`` naming the field; each side turns that into its own error
(the node's 422 ``InvalidField``, the fake's ``InvalidBulkAction`` with the same body).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Final, TypedDict, Unpack

from consumers_sdk import validation

SAMPLE_SIZE: Final = 20  # jobs a dry run shows
MAX_ERROR_TEXT: Final = 1000  # characters of ``error_contains``
# The states each action changes: those its one-job route accepts (``DELETE``, ``PATCH`` and
# ``POST .../requeue`` of /v1/jobs answer 409 for the others).
APPLIES_TO: Final = MappingProxyType(
    {
        "cancel": ("scheduled", "waiting"),
        "reschedule": ("scheduled", "waiting"),
        "requeue": ("dead",),
    }
)


class Refused(ValueError):
    """A request the node refuses: the field at fault (``filter.state``...) and why."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class Asked(TypedDict, total=False):
    """A request's filter conditions, as given (its namespace is the caller's business)."""

    state: str | None
    routing_key: str | None
    routing_key_prefix: str | None
    run_at_from: datetime | None
    run_at_to: datetime | None
    finished_from: datetime | None
    finished_to: datetime | None
    error_contains: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Conditions:
    """A filter's checked conditions (None matches anything): the states it may change, the
    prefix as its words, the ranges in UTC."""

    states: tuple[str, ...]
    routing_key: str | None = None
    routing_key_prefix: str | None = None
    run_at_from: datetime | None = None
    run_at_to: datetime | None = None
    finished_from: datetime | None = None  # a finished job's updated_at
    finished_to: datetime | None = None
    error_contains: str | None = None


def check_conditions(action: str, **asked: Unpack[Asked]) -> Conditions:
    """The filter's conditions for ``action`` (one of ``APPLIES_TO``), or ``Refused``."""
    states = APPLIES_TO[action]
    state, routing_key = asked.get("state"), asked.get("routing_key")
    routing_key_prefix, error_contains = (
        asked.get("routing_key_prefix"),
        asked.get("error_contains"),
    )
    if state is not None:
        if state not in states:
            raise Refused("filter.state", f"a {action} changes {' or '.join(states)} jobs")
        states = (state,)
    if routing_key is not None and (
        problem := validation.routing_key_problem(routing_key.rstrip("."))
    ):
        raise Refused("filter.routing_key", problem)
    prefix: str | None = None
    if routing_key_prefix is not None:
        prefix, problem = validation.prefix_words(routing_key_prefix)
        if problem:
            raise Refused("filter.routing_key_prefix", problem)
    run_at_from, run_at_to = _range("run_at", asked.get("run_at_from"), asked.get("run_at_to"))
    finished_from, finished_to = _range(
        "finished", asked.get("finished_from"), asked.get("finished_to")
    )
    if (finished_from or finished_to) and action != "requeue":
        raise Refused(
            "filter.finished_from" if finished_from else "filter.finished_to",
            "only finished (dead) jobs have one: use it with requeue",
        )
    if error_contains is not None and not 0 < len(error_contains) <= MAX_ERROR_TEXT:
        raise Refused("filter.error_contains", f"1 to {MAX_ERROR_TEXT} characters")
    if error_contains is not None and "\x00" in error_contains:
        raise Refused("filter.error_contains", "must not contain NUL")
    return Conditions(
        states=states,
        routing_key=routing_key,
        routing_key_prefix=prefix,
        run_at_from=run_at_from,
        run_at_to=run_at_to,
        finished_from=finished_from,
        finished_to=finished_to,
        error_contains=error_contains,
    )


def _range(
    name: str, start: datetime | None, end: datetime | None
) -> tuple[datetime | None, datetime | None]:
    """The range in UTC, or ``Refused`` naming the bound at fault."""
    start = utc(f"filter.{name}_from", start)
    end = utc(f"filter.{name}_to", end)
    if start is not None and end is not None and end < start:
        raise Refused(f"filter.{name}_to", f"must not be before {name}_from")
    return start, end


def utc(field: str, value: datetime | None) -> datetime | None:
    """An instant in UTC; a naive one, or one that UTC cannot hold (year 1 at +01:00), refused."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise Refused(field, "must have a timezone")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise Refused(field, "out of range") from None


def check_change(
    action: str,
    *,
    run_at: datetime | None,
    shift_s: float | None,
    now: datetime,
    max_delay_days: int,
) -> tuple[datetime | None, float | None]:
    """A reschedule's new ``run_at`` (in UTC) or ``shift_s``, exactly one; none for the other
    actions; or ``Refused``."""
    if action != "reschedule":
        for field, value in (("run_at", run_at), ("shift_s", shift_s)):
            if value is not None:
                raise Refused(field, f"only a reschedule takes {field}")
        return None, None
    if (run_at is None) == (shift_s is None):
        raise Refused("run_at", "a reschedule takes either run_at or shift_s")
    if shift_s is not None:
        if not math.isfinite(shift_s) or shift_s == 0:
            raise Refused("shift_s", "a number of seconds other than 0")
        if abs(shift_s) > max_delay_days * 86400:
            raise Refused("shift_s", f"at most {max_delay_days} days either way")
        return None, shift_s
    due = utc("run_at", run_at)
    assert due is not None
    limits = validation.Limits(max_delay_days=max_delay_days)
    if problem := validation.due_problem(due, now, limits):
        raise Refused("run_at", problem)
    return due, None


def detail(action_id: object, action: str) -> str:
    """What a changed job's history step says about the action that changed it."""
    return f"bulk action {action_id}: {action}"
