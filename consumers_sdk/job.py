"""Job: a read-only view of one delivery, decoded by the message contract; and the copies the SDK
publishes when a delivery moves on (to a wait queue, to .dead, back from .dead).

Headers the SDK writes (``x-retry-`` is reserved by the contract, so no producer sets these):

- ``x-retry-attempt``: the attempt number of the next delivery of a retried job;
- ``x-retry-last-error``: what the previous attempt raised;
- ``x-retry-routing-key``: the job's own routing key (a retried job comes back addressed to its
  work queue, so its delivery routing key is the queue name);
- (``x-retry-max-attempts`` and ``x-retry-backoff-s`` are the job's own retry policy, set by the
  dispatcher: see ``contract``; they stay with the job when it dies or is revived);
- on a dead job, ``x-dead-error``, ``x-dead-attempts``, ``x-dead-at``, ``x-dead-queue`` and
  ``x-dead-routing-key``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aio_pika
import orjson
from aio_pika.abc import AbstractIncomingMessage, FieldValue

from consumers_sdk import contract

HEADER_ATTEMPT = "x-retry-attempt"
HEADER_LAST_ERROR = "x-retry-last-error"
HEADER_ROUTING_KEY = "x-retry-routing-key"
DEAD_ERROR = "x-dead-error"
DEAD_ATTEMPTS = "x-dead-attempts"
DEAD_AT = "x-dead-at"
DEAD_QUEUE = "x-dead-queue"
DEAD_ROUTING_KEY = "x-dead-routing-key"
# What RabbitMQ and the SDK record about a job's failed life. A dead job is parked without it, so
# one moved back to its work queue by any means (the CLI, the RabbitMQ UI) starts at attempt 1.
HISTORY_PREFIXES = ("x-death", "x-first-death", "x-last-death", "x-delivery-count", "x-retry-")


class Undecodable(Exception):
    """The delivery does not follow the message contract; it goes to the dead-letter queue."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    id: str
    routing_key: str
    payload: Any
    headers: Mapping[str, object]  # the producer's own headers
    attempt: int  # 1 for the first delivery, 2 for the first retry, ...
    run_at: datetime | None
    idempotency_key: str | None
    message: AbstractIncomingMessage = field(repr=False, compare=False)
    dispatch_round: str | None = None  # the dispatch this delivery belongs to; events echo it


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def attempt_of(headers: Mapping[str, object], work_queue: str) -> int:
    """Deliveries so far, counting this one.

    RabbitMQ keeps one ``x-death`` entry per (queue, reason) with a count: the expiries from this
    work queue's wait queues are the retries so far (RabbitMQ 3.10 to 3.13 carry the counts across
    the SDK's republish). RabbitMQ 4 ignores ``x-death`` set by a client, so the SDK's own
    ``x-retry-attempt`` also counts; the higher of the two wins.
    """
    retries = 0
    deaths = headers.get("x-death")
    if isinstance(deaths, list):
        for death in deaths:
            if not isinstance(death, Mapping):
                continue
            queue = _text(death.get("queue", ""))
            if _text(death.get("reason", "")) == "expired" and queue.startswith(
                f"{work_queue}.retry."
            ):
                count = death.get("count", 1)
                retries += count if isinstance(count, int) else 1
    carried = headers.get(HEADER_ATTEMPT)
    return max(retries + 1, carried if isinstance(carried, int) else 1)


def routing_key_of(message: AbstractIncomingMessage) -> str:
    """The job's own routing key, wherever the delivery has travelled since it was fired."""
    headers = message.headers or {}
    for name in (HEADER_ROUTING_KEY, DEAD_ROUTING_KEY):
        if headers.get(name):
            return _text(headers[name])
    # Never retried by the SDK, but dead-lettered by RabbitMQ (delivery limit, ttl): the oldest
    # x-death entry holds the routing keys it was fired with.
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[-1], Mapping):
        keys = deaths[-1].get("routing-keys")
        if isinstance(keys, list) and keys:
            return _text(keys[0])
    return message.routing_key or ""


def from_message(message: AbstractIncomingMessage, *, work_queue: str) -> Job:
    headers = dict(message.headers or {})
    if message.content_type not in (None, contract.CONTENT_TYPE):
        raise Undecodable(f"content_type {message.content_type!r} is not {contract.CONTENT_TYPE}")
    try:
        envelope = contract.read_envelope(
            message_id=message.message_id, routing_key=routing_key_of(message), headers=headers
        )
        payload = orjson.loads(message.body)
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise Undecodable(str(exc)) from exc
    return Job(
        id=envelope.job_id,
        routing_key=envelope.routing_key,
        payload=payload,
        headers={k: v for k, v in headers.items() if not contract.is_reserved_header(k)},
        attempt=attempt_of(headers, work_queue),
        run_at=envelope.run_at,
        idempotency_key=envelope.idempotency_key,
        message=message,
        dispatch_round=envelope.dispatch_round,
    )


def _copy(message: AbstractIncomingMessage, headers: dict[str, FieldValue]) -> aio_pika.Message:
    # Every property but ``expiration``: a job's ttl bounds its first delivery, and a per-message
    # ttl inside a wait queue would send it back before its tier is up.
    return aio_pika.Message(
        body=message.body,
        headers=headers,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        priority=message.priority,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        message_id=message.message_id,
        timestamp=message.timestamp,
        type=message.type,
        user_id=None,  # RabbitMQ checks user_id against the publishing user
        app_id=message.app_id,
    )


def _without_history(message: AbstractIncomingMessage) -> dict[str, FieldValue]:
    # The job's own retry policy is not history: a job revived from .dead keeps it.
    return {
        name: value
        for name, value in (message.headers or {}).items()
        if not name.lower().startswith(HISTORY_PREFIXES)
        or name.lower() in contract.RETRY_POLICY_HEADERS
    }


def retry_copy(job: Job, *, error: str, work_queue: str) -> aio_pika.Message:
    """The job as it waits for its next attempt: its history kept, the next attempt number set.

    ``x-death`` loses any entry for the work queue itself (RabbitMQ dead-lettered the job out of
    it once: delivery limit, ttl; then it was moved back by hand): RabbitMQ drops a job that
    dead-letters into a queue its ``x-death`` names with no rejection since, as a cycle.
    """
    headers: dict[str, FieldValue] = {
        name: value
        for name, value in (job.message.headers or {}).items()
        if name.lower() != "x-delivery-count"  # the work queue's own count, not ours to carry
    }
    deaths = headers.get("x-death")
    if isinstance(deaths, list):
        headers["x-death"] = [
            death
            for death in deaths
            if not (isinstance(death, Mapping) and _text(death.get("queue", "")) == work_queue)
        ]
    headers[HEADER_ATTEMPT] = job.attempt + 1
    headers[HEADER_LAST_ERROR] = error
    headers[HEADER_ROUTING_KEY] = job.routing_key
    return _copy(job.message, headers)


def dead_copy(
    message: AbstractIncomingMessage, *, attempts: int, error: str, work_queue: str, at: datetime
) -> aio_pika.Message:
    """The job as it is parked in .dead: body and properties kept, the failure in its headers."""
    headers = _without_history(message)
    headers.update(
        {
            DEAD_ERROR: error,
            DEAD_ATTEMPTS: attempts,
            DEAD_AT: contract.format_run_at(at),
            DEAD_QUEUE: work_queue,
            DEAD_ROUTING_KEY: routing_key_of(message),
        }
    )
    return _copy(message, headers)


def returned_copy(message: AbstractIncomingMessage) -> tuple[str, aio_pika.Message]:
    """A dead job sent back to its original routing key with every header it has kept: the
    ``x-dead-`` ones (attempts, error, time, queue) stay as its history. A dead copy carries no
    ``x-death``/``x-retry-`` counters, so its attempts start over. Returns (routing key, message).
    """
    routing_key = routing_key_of(message)
    headers = dict(message.headers or {})
    headers[HEADER_ROUTING_KEY] = routing_key
    return routing_key, _copy(message, headers)


def revived_copy(message: AbstractIncomingMessage) -> aio_pika.Message:
    """A dead job sent back to its work queue: attempts start afresh, its routing key is kept."""
    routing_key = routing_key_of(message)
    headers = {
        name: value
        for name, value in _without_history(message).items()
        if not name.lower().startswith("x-dead-")
    }
    if routing_key:
        headers[HEADER_ROUTING_KEY] = routing_key
    return _copy(message, headers)
