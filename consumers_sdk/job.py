"""Job: a read-only view of one delivery, decoded by the message contract."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from aio_pika.abc import AbstractIncomingMessage

from consumers_sdk import contract

HEADER_ATTEMPT = "x-retry-attempt"
HEADER_LAST_ERROR = "x-retry-last-error"
# A retried delivery comes back addressed to the work queue; this keeps the job's own key.
HEADER_ROUTING_KEY = "x-retry-routing-key"


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


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def attempt_of(headers: Mapping[str, object], work_queue: str) -> int:
    """Deliveries so far, counting this one: the retries RabbitMQ recorded in ``x-death``
    (expiries from this work queue's wait queues) plus one, or the SDK's own header if higher."""
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


def from_message(message: AbstractIncomingMessage, *, work_queue: str) -> Job:
    headers = dict(message.headers or {})
    if message.content_type not in (None, contract.CONTENT_TYPE):
        raise Undecodable(f"content_type {message.content_type!r} is not {contract.CONTENT_TYPE}")
    try:
        envelope = contract.read_envelope(
            message_id=message.message_id,
            routing_key=_text(headers.get(HEADER_ROUTING_KEY) or message.routing_key or ""),
            headers=headers,
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
    )
