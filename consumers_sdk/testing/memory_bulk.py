"""Bulk actions as the in-memory API (``memory_api``) checks and matches them: the node's filter
rules (``dispatcher.bulk.model``, its ``bulk_match`` SQL) and the history details its SQL writes,
without importing the node. ``tests/e2e/test_sdk_client.py`` pins them to a real node."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from consumers_sdk import errors, validation

SAMPLE = 20  # jobs a dry run shows
ERROR_TEXT = 1000  # characters of ``error_contains``
NAMESPACE = re.compile(r"[A-Za-z0-9_\-]{1,64}")
STATES: Mapping[str, tuple[str, ...]] = {  # the states each action changes
    "cancel": ("scheduled", "waiting"),
    "reschedule": ("scheduled", "waiting"),
    "requeue": ("dead",),
}
RANGES = (("run_at", "run_at"), ("finished", "updated_at"))  # filter range -> the job's column


def _bad(field: str, problem: str) -> errors.ClientError:
    message = f"{field}: {problem}"
    fields = [{"field": field, "message": problem}]
    body: dict[str, object] = {"error": "invalid_request", "message": message, "fields": fields}
    return errors.InvalidBulkAction(422, message, body)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A checked request: the action, its filter (as the node stores it) and a reschedule's
    ``run_at`` or ``shift_s``."""

    action: str
    filter: dict[str, Any]
    run_at: datetime | None
    shift_s: float | None


def _utc_field(field: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise _bad(field, "must have a timezone")
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise _bad(field, "out of range") from None


def _checked_filter(action: str, asked: Mapping[str, Any]) -> dict[str, Any]:
    """The node's ``bulk.check_filter`` for an admin's key (the fake's caller)."""
    namespace = asked.get("namespace")
    if namespace and not NAMESPACE.fullmatch(namespace):
        raise _bad("filter.namespace", "a namespace is 1-64 letters, digits, '_' or '-'")
    states = STATES[action]
    state = asked.get("state")
    if state is not None:
        if state not in states:
            raise _bad("filter.state", f"a {action} changes {' or '.join(states)} jobs")
        states = (state,)
    key, prefix = asked.get("routing_key"), asked.get("routing_key_prefix")
    if key is not None and (problem := validation.routing_key_problem(key.rstrip("."))):
        raise _bad("filter.routing_key", problem)
    if prefix is not None:
        prefix, problem = validation.prefix_words(prefix)
        if problem:
            raise _bad("filter.routing_key_prefix", problem)
    spec: dict[str, Any] = {"namespace": namespace, "states": list(states)}
    spec["routing_key"], spec["routing_key_prefix"] = key, prefix
    for name, _ in RANGES:
        start = _utc_field(f"filter.{name}_from", asked.get(f"{name}_from"))
        end = _utc_field(f"filter.{name}_to", asked.get(f"{name}_to"))
        if start is not None and end is not None and end < start:
            raise _bad(f"filter.{name}_to", f"must not be before {name}_from")
        spec[f"{name}_from"], spec[f"{name}_to"] = start, end
    if (spec["finished_from"] or spec["finished_to"]) and action != "requeue":
        field = "filter.finished_from" if spec["finished_from"] else "filter.finished_to"
        raise _bad(field, "only finished (dead) jobs have one: use it with requeue")
    error = asked.get("error_contains")
    if error is not None and not 0 < len(error) <= ERROR_TEXT:
        raise _bad("filter.error_contains", f"1 to {ERROR_TEXT} characters")
    if error is not None and "\x00" in error:
        raise _bad("filter.error_contains", "must not contain NUL")
    spec["error_contains"] = error
    return spec


def plan(body: Mapping[str, Any], now: datetime) -> Plan:
    """The checked request, or InvalidBulkAction naming the field as the node's 422 does."""
    action = body["action"]
    spec = _checked_filter(action, body.get("filter") or {})
    run_at, shift_s = body.get("run_at"), body.get("shift_s")
    if action != "reschedule":
        for field, value in (("run_at", run_at), ("shift_s", shift_s)):
            if value is not None:
                raise _bad(field, f"only a reschedule takes {field}")
        return Plan(action=action, filter=spec, run_at=None, shift_s=None)
    if (run_at is None) == (shift_s is None):
        raise _bad("run_at", "a reschedule takes either run_at or shift_s")
    limits = validation.DEFAULT_LIMITS
    if shift_s is not None:
        if not math.isfinite(shift_s) or shift_s == 0:
            raise _bad("shift_s", "a number of seconds other than 0")
        if abs(shift_s) > limits.max_delay_days * 86400:
            raise _bad("shift_s", f"at most {limits.max_delay_days} days either way")
        return Plan(action=action, filter=spec, run_at=None, shift_s=float(shift_s))
    due = _utc_field("run_at", run_at)
    assert due is not None
    if problem := validation.due_problem(due, now, limits):
        raise _bad("run_at", problem)
    return Plan(action=action, filter=spec, run_at=due, shift_s=None)


def within(routing_key: str, prefix: str) -> bool:
    """Whether a routing key is these words or below them (``billing``: never ``billingx``)."""
    return routing_key == prefix or routing_key.startswith(prefix + ".")


def matches(job: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Whether a job is one the filter matches, as the node's ``bulk_match`` and its states."""
    namespace, key, prefix = spec["namespace"], spec["routing_key"], spec["routing_key_prefix"]
    error = spec["error_contains"]
    if job["state"] not in spec["states"]:
        return False
    if namespace is not None and (job["namespace"] or "") != namespace:
        return False
    if (key is not None and job["routing_key"] != key) or (
        prefix is not None and not within(job["routing_key"], prefix)
    ):
        return False
    for name, column in RANGES:
        moment = datetime.fromisoformat(job[column])
        start, end = spec[f"{name}_from"], spec[f"{name}_to"]
        if (start is not None and moment < start) or (end is not None and moment > end):
            return False
    last_error = job["last_error"]
    return error is None or (last_error is not None and error.lower() in last_error.lower())


def filter_document(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The filter as the node shows it: the conditions given, times in UTC as orjson's
    ``OPT_UTC_Z`` writes them."""
    return {
        name: value.isoformat().replace("+00:00", "Z") if isinstance(value, datetime) else value
        for name, value in spec.items()
        if value is not None
    }


def detail(action_id: str, action: str) -> str:
    """What a changed job's history step says about the action (the node's ``bulk.detail``)."""
    return f"bulk action {action_id}: {action}"


def moved_detail(action_id: str, run_at: datetime) -> str:
    """A rescheduled job's detail: the action and the new time, in milliseconds, as SQL's
    ``to_char(... 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`` writes it."""
    moment = run_at.astimezone(UTC)
    millis = f"{moment.microsecond // 1000:03d}"  # truncated, as to_char's MS
    return f"{detail(action_id, 'reschedule')} to {moment:%Y-%m-%dT%H:%M:%S}.{millis}Z"
