"""Bulk actions as the in-memory API (``memory_api``) checks and matches them. The rules are the
node's own (``bulk_rules``, which ``dispatcher.bulk.model`` imports too); what is the fake's is
matching its stored jobs as the node's ``bulk_match`` SQL does, and the history details that SQL
writes. ``tests/e2e/test_sdk_client.py`` pins the fake to a real node."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from consumers_sdk import bulk_rules, errors, validation

# Each range of the filter and the stored job's field it bounds (a finished job's: updated_at).
COLUMNS: Mapping[str, str] = {"run_at": "run_at", "finished": "updated_at"}


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


def _moment(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _checked_filter(action: str, asked: Mapping[str, Any]) -> dict[str, Any]:
    """The node's ``bulk.check_filter`` for an admin's key (the fake's caller)."""
    namespace = asked.get("namespace")
    if namespace and (problem := validation.namespace_problem(namespace)):
        raise _bad("filter.namespace", problem)
    conditions = bulk_rules.check_conditions(
        action,
        state=asked.get("state"),
        routing_key=asked.get("routing_key"),
        routing_key_prefix=asked.get("routing_key_prefix"),
        run_at_from=_moment(asked.get("run_at_from")),
        run_at_to=_moment(asked.get("run_at_to")),
        finished_from=_moment(asked.get("finished_from")),
        finished_to=_moment(asked.get("finished_to")),
        error_contains=asked.get("error_contains"),
    )
    spec = {"namespace": namespace, **dataclasses.asdict(conditions)}
    spec["states"] = list(conditions.states)
    return spec


def plan(body: Mapping[str, Any], now: datetime) -> Plan:
    """The checked request, or InvalidBulkAction naming the field as the node's 422 does."""
    action = body["action"]
    try:
        spec = _checked_filter(action, body.get("filter") or {})
        run_at, shift_s = bulk_rules.check_change(
            action,
            run_at=_moment(body.get("run_at")),
            shift_s=body.get("shift_s"),
            now=now,
            max_delay_days=validation.DEFAULT_LIMITS.max_delay_days,
        )
    except bulk_rules.Refused as refused:
        raise _bad(refused.field, refused.problem) from None
    shift = None if shift_s is None else float(shift_s)
    return Plan(action=action, filter=spec, run_at=run_at, shift_s=shift)


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
    for name, column in COLUMNS.items():
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


def moved_detail(action_id: str, run_at: datetime) -> str:
    """A rescheduled job's detail: the action and the new time, in milliseconds, as SQL's
    ``to_char(... 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`` writes it."""
    moment = run_at.astimezone(UTC)
    millis = f"{moment.microsecond // 1000:03d}"  # truncated, as to_char's MS
    return f"{bulk_rules.detail(action_id, 'reschedule')} to {moment:%Y-%m-%dT%H:%M:%S}.{millis}Z"
