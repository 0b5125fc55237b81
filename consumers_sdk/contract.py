"""The message contract between the dispatcher (publisher) and consumers.

One module, imported by both sides, so the names and the header encoding can only change together.
It is pure: no AMQP client, no I/O.

A fired job is published to the topic exchange ``EXCHANGE`` with the job's routing key:

- body: the job's payload as JSON (UTF-8); ``content_type`` is ``application/json``;
- ``delivery_mode`` persistent, ``message_id`` = the job id, ``timestamp`` = dispatch time;
- ``priority`` and ``expiration`` (the remaining ttl, in ms) when the job has them;
- headers ``x-job-id``, ``x-run-at`` (RFC 3339, UTC, millisecond precision), ``x-idempotency-key``
  when given, and the producer's own headers.

Jobs whose routing key has no bound queue are routed by the alternate exchange
``UNROUTABLE_EXCHANGE`` to the durable queue ``UNROUTABLE_QUEUE`` instead of being dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

EXCHANGE: Final = "dispatcher.jobs"
UNROUTABLE_EXCHANGE: Final = "dispatcher.unroutable"
UNROUTABLE_QUEUE: Final = "dispatcher.unroutable"
CONTENT_TYPE: Final = "application/json"


def exchange_arguments(unroutable_exchange: str = UNROUTABLE_EXCHANGE) -> dict[str, str]:
    """Arguments of the jobs exchange; whoever declares it first must use exactly these."""
    return {"alternate-exchange": unroutable_exchange}


HEADER_JOB_ID: Final = "x-job-id"
HEADER_RUN_AT: Final = "x-run-at"
HEADER_IDEMPOTENCY_KEY: Final = "x-idempotency-key"

# Producers may not set these: the dispatcher, RabbitMQ's dead-lettering and the consumer SDK
# own them, and a producer value would be silently overwritten or misread.
RESERVED_HEADER_PREFIXES: Final = (
    "x-job-",
    "x-run-at",
    "x-idempotency-",
    "x-dispatcher-",
    "x-consumer-",
    "x-death",
    "x-first-death",
    "x-last-death",
    "x-delay",
    "x-retry-",
)

HeaderValue = str | int | float | bool


def is_reserved_header(name: str) -> bool:
    """True for a header name that only the dispatcher, the SDK or RabbitMQ may set."""
    lowered = name.lower()
    return any(lowered.startswith(prefix) for prefix in RESERVED_HEADER_PREFIXES)


def format_run_at(run_at: datetime) -> str:
    """RFC 3339 in UTC with millisecond precision, e.g. ``2026-11-22T08:00:00.000Z``."""
    return run_at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_run_at(text: str) -> datetime:
    """Inverse of ``format_run_at``; accepts any RFC 3339 offset."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEnvelope:
    """What a consumer learns about a job from the message, independent of the AMQP client."""

    job_id: str
    routing_key: str
    run_at: datetime | None
    idempotency_key: str | None
    headers: Mapping[str, object]


def message_headers(
    *,
    job_id: str,
    run_at: datetime,
    idempotency_key: str | None,
    user_headers: Mapping[str, HeaderValue],
) -> dict[str, HeaderValue]:
    """The AMQP headers of a fired job: the producer's headers plus the contract's own."""
    headers: dict[str, HeaderValue] = dict(user_headers)
    headers[HEADER_JOB_ID] = job_id
    headers[HEADER_RUN_AT] = format_run_at(run_at)
    if idempotency_key is not None:
        headers[HEADER_IDEMPOTENCY_KEY] = idempotency_key
    return headers


def read_envelope(
    *, message_id: str | None, routing_key: str, headers: Mapping[str, object]
) -> JobEnvelope:
    """Read the contract's fields back from a delivery; raises ValueError when they are missing."""
    job_id = message_id or _as_str(headers.get(HEADER_JOB_ID))
    if not job_id:
        raise ValueError("message has neither message_id nor x-job-id")
    run_at_text = _as_str(headers.get(HEADER_RUN_AT))
    return JobEnvelope(
        job_id=job_id,
        routing_key=routing_key,
        run_at=parse_run_at(run_at_text) if run_at_text else None,
        idempotency_key=_as_str(headers.get(HEADER_IDEMPOTENCY_KEY)),
        headers=headers,
    )


def _as_str(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
