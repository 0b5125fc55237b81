"""How a ``Call`` is sent: the retry and replay rules, the HTTP client's settings, and the answer
turned into a record or a typed error. Written once; the async and the sync client only send and
sleep.

4xx answers raise typed errors at once, but 429: it and 503 (the dispatcher stored nothing) and
failures to connect are retried with backoff, a 429 no sooner than its Retry-After; a request
lost after it was sent is retried only when replaying it is harmless (``Call.replay_safe``: a
GET, a POST whose every job carries an idempotency key).
"""

from __future__ import annotations

import random
import re
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
import orjson

from consumers_sdk import calls, errors, records, retry

T = TypeVar("T")
Outcome = httpx.Response | httpx.TransportError
# The request never reached the dispatcher: always safe to send again.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
FIRST_PAUSE_S = 0.2
MAX_PAUSE_S = 5.0
MAX_RETRY_AFTER_S = 60.0
# Answers that stored nothing and ask to be sent again: a node busy with as much of the call's kind
# as it takes at once (429, Retry-After), or unavailable (503).
RETRIED = frozenset({429, 503})
DEFAULT_URL = "http://127.0.0.1:8080"
BATCH_LIMIT = 1000  # the API's jobs per batch by default (DISPATCHER_MAX_BATCH)


@dataclass(frozen=True, slots=True)
class Done(Generic[T]):
    """The last step of ``attempts``: the call's record."""

    value: T


Steps = Generator[float | Done[T], Outcome, None]


def client_options(base_url: str, api_key: str | None, timeout_s: float) -> dict[str, Any]:
    """What ``httpx.AsyncClient`` and ``httpx.Client`` are built with."""
    # The key travels in a header only; it is never part of an error or a repr. Every write is
    # JSON, the body-less ones too: the node refuses writes a browser form could make.
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return {"base_url": base_url, "headers": headers, "timeout": timeout_s}


def request_options(call: calls.Call[Any]) -> dict[str, Any]:
    """The arguments of ``client.request`` for one send of ``call``."""
    options: dict[str, Any] = {"method": call.method, "url": call.path}
    if call.params:
        options["params"] = dict(call.params)
    if call.json is not None:
        options["json"] = call.json
    return options


def attempts(call: calls.Call[T], *, retries: int, rng: random.Random | None = None) -> Steps[T]:
    """Yields the seconds to wait before each send (0 before the first) and is sent what each
    send gave (a response, or the transport error); yields ``Done`` with the call's record last,
    or raises its typed error."""
    # Jittered: clients do not come back in step.
    pauses = retry.Doubling(first_s=FIRST_PAUSE_S, max_s=MAX_PAUSE_S, rng=rng or random.Random())
    outcome = yield 0.0
    for attempt in range(retries + 1):
        last = attempt == retries
        if isinstance(outcome, httpx.TransportError):
            if last or not (call.replay_safe or isinstance(outcome, NOT_SENT)):
                raise errors.DispatcherUnavailable(0, f"no answer: {outcome!r}") from outcome
        elif outcome.status_code < 400:
            yield Done(parsed(call, outcome))
            return
        elif outcome.status_code not in RETRIED or last:
            raise error(outcome, call.subject)
        outcome = yield max(pauses.next(), retry_after_s(outcome))
    raise AssertionError("unreachable")


def retry_after_s(response: Outcome) -> float:
    """The seconds a 429's Retry-After asks for (0 without one), never more than a minute."""
    if isinstance(response, httpx.TransportError):
        return 0.0
    try:
        asked = float(response.headers.get("retry-after", "0"))
    except ValueError:  # an HTTP date: not what the dispatcher sends
        return 0.0
    return min(max(asked, 0.0), MAX_RETRY_AFTER_S) if response.status_code == 429 else 0.0


def parsed(call: calls.Call[T], response: httpx.Response) -> T:
    try:
        return call.parse(orjson.loads(response.content))
    except (ValueError, KeyError, TypeError) as exc:  # not JSON, or not the record's shape
        raise errors.ClientError(
            response.status_code, f"unexpected answer to {call.method} {call.path}: {exc!r}"
        ) from None


_NOT_FOUND = {
    "job": errors.JobNotFound,
    "schedule": errors.ScheduleNotFound,
    "limit": errors.FlowRuleNotFound,
    "bulk": errors.BulkActionNotFound,
}
_CONFLICT = {
    "job": errors.JobConflict,
    "schedule": errors.ScheduleConflict,
    "limit": errors.FlowRuleConflict,
    "bulk": errors.BulkActionConflict,
}
_INVALID = {
    "job": errors.InvalidJob,
    "schedule": errors.InvalidSchedule,
    "limit": errors.InvalidFlowRule,
    "bulk": errors.InvalidBulkAction,
}


def error(response: httpx.Response, subject: calls.Subject = "job") -> errors.ClientError:
    """The typed error of a refused request (``subject``: what its path names)."""
    try:
        body = orjson.loads(response.content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"message": response.text}
    message = str(body.get("message", response.reason_phrase))
    status = response.status_code
    kind: type[errors.ClientError] = errors.ClientError
    if status in (401, 403):
        kind = errors.AccessDenied
    elif status in (400, 413, 422):
        kind = _INVALID[subject]
    elif status == 404:
        kind = _NOT_FOUND[subject]
    elif status == 409:
        kind = _CONFLICT[subject]
    elif status == 503:
        kind = errors.DispatcherUnavailable
    return kind(status, message, body)


def chunks(jobs: Sequence[Any], size: int) -> Iterator[tuple[int, Sequence[Any]]]:
    """``(offset, jobs[offset:offset + size])`` for each chunk of a ``schedule_many``."""
    if size < 1:
        raise ValueError("chunk_size must be at least 1")
    for offset in range(0, len(jobs), size):
        yield offset, jobs[offset : offset + size]


def partly_stored(
    refused: errors.ClientError, stored: Sequence[records.JobRecord], offset: int
) -> errors.ClientError:
    """The error of a chunk, saying how many jobs the chunks before it stored (``.stored``) and
    naming the fields by their index in the caller's whole list. The first chunk's is as it was."""
    if offset == 0:
        return refused

    def shifted(match: re.Match[str]) -> str:
        return f"jobs[{int(match.group(1)) + offset}]"

    body = dict(refused.body)
    fields = body.get("fields")
    if isinstance(fields, list):
        body["fields"] = [
            {**item, "field": re.sub(r"^jobs\[(\d+)\]", shifted, str(item.get("field", "")))}
            if isinstance(item, dict)
            else item
            for item in fields
        ]
    message = (
        f"{refused.message} (the chunk from jobs[{offset}] failed; the {len(stored)} jobs "
        "before it were stored: .stored)"
    )
    failed = type(refused)(refused.status, message, body)
    failed.stored = tuple(stored)
    return failed
