"""The message contract between the dispatcher (publisher) and consumers.

One module, imported by both sides, so the names and the header encoding can only change together.
It is pure: no AMQP client, no I/O.

A fired job is published to the topic exchange ``EXCHANGE`` with the job's routing key:

- body: the job's payload as JSON (UTF-8); ``content_type`` is ``application/json``;
- ``delivery_mode`` persistent, ``message_id`` = the job id, ``timestamp`` = dispatch time;
- ``priority`` and ``expiration`` (the remaining ttl, in ms) when the job has them;
- headers ``x-job-id``, ``x-run-at`` (RFC 3339, UTC, millisecond precision), ``x-dispatcher-round``
  (the dispatch round: see "job events" below), ``x-idempotency-key`` when given, the job's own
  retry policy when given (``x-retry-max-attempts``, ``x-retry-backoff-s``: see "per-job retry
  policy" below), and the producer's own headers (``producer_headers``: reserved names are never
  published).

Jobs whose routing key has no bound queue are routed by the alternate exchange
``UNROUTABLE_EXCHANGE`` to the durable queue ``UNROUTABLE_QUEUE`` instead of being dropped.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import orjson

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
HEADER_ROUND: Final = "x-dispatcher-round"  # this dispatch of the job; events echo it

# Producers may not set these: the dispatcher, the consumer SDK and RabbitMQ give them meaning,
# and a producer value would be silently overwritten or misread (an ``x-dead-routing-key`` would
# send the job elsewhere when it is taken back from .dead). Compared case-insensitively.
RESERVED_HEADER_PREFIXES: Final = (
    "x-job-",
    "x-run-at",
    "x-idempotency-",
    "x-dispatcher-",  # the dispatch round, see "job events" below
    "x-consumer-",
    "x-death",  # RabbitMQ's dead-lettering: x-death, x-first-death-*, x-last-death-*
    "x-first-death",
    "x-last-death",
    "x-dead-",  # the SDK's dead-letter bookkeeping
    "x-delivery-",  # RabbitMQ's x-delivery-count on quorum queues
    "x-delay",
    "x-retry-",
    "x-received-from",  # federation
    "x-shovelled",  # shovels
    "x-stream-",  # streams (offsets, filters)
    "x-opt-",  # AMQP 1.0 message annotations
)
# Sender-selected distribution: RabbitMQ routes a copy to each key they list, and strips BCC.
RESERVED_HEADER_NAMES: Final = frozenset({"cc", "bcc"})
# AMQP field-table names: RabbitMQ cuts longer ones, so a producer's header would arrive renamed.
MAX_HEADER_NAME_BYTES: Final = 128

HeaderValue = str | int | float | bool


def is_reserved_header(name: str) -> bool:
    """True for a header name that only the dispatcher, the SDK or RabbitMQ may set."""
    lowered = name.lower()
    return lowered in RESERVED_HEADER_NAMES or lowered.startswith(RESERVED_HEADER_PREFIXES)


def header_name_problem(name: str) -> str | None:
    """Why a producer may not give a header this name (None when it may): the one rule the API,
    schedules and ``enqueue`` apply."""
    if is_reserved_header(name):
        return f"header {name!r} is reserved for the dispatcher and RabbitMQ"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_HEADER_NAME_BYTES:
        return f"header names must be at most {MAX_HEADER_NAME_BYTES} bytes (AMQP cuts longer ones)"
    return None


def producer_headers(headers: Mapping[str, HeaderValue]) -> dict[str, HeaderValue]:
    """A stored job's headers as they may be published: reserved names are dropped (a row written
    before a name was reserved, or by hand, must not forge one), but for the job's own retry
    policy, which the dispatcher and ``enqueue`` store there."""
    return {
        name: value
        for name, value in headers.items()
        if not is_reserved_header(name) or name in RETRY_POLICY_HEADERS
    }


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
    dispatch_round: str | None = None  # None: published by something else than a dispatcher


def message_headers(
    *,
    job_id: str,
    run_at: datetime,
    idempotency_key: str | None,
    user_headers: Mapping[str, HeaderValue],
    dispatch_round: str | None = None,
) -> dict[str, HeaderValue]:
    """The AMQP headers of a fired job: the producer's headers plus the contract's own."""
    headers = producer_headers(user_headers)
    headers[HEADER_JOB_ID] = job_id
    headers[HEADER_RUN_AT] = format_run_at(run_at)
    if dispatch_round is not None:
        headers[HEADER_ROUND] = dispatch_round
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
        dispatch_round=read_round(headers),
    )


def read_round(headers: Mapping[str, object]) -> str | None:
    """The dispatch round a delivery carries, as it is echoed in events (None when absent)."""
    return _as_str(headers.get(HEADER_ROUND)) or None


def _as_str(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


# --- job events: what consumers report back -----------------------------------------------------
#
# The SDK publishes the events of each step of an attempt to the durable topic exchange
# ``EVENTS_EXCHANGE`` with the job's routing key as routing key (so that RabbitMQ's topic
# permissions can hold a consumer's user to its own keys; SDKs before used the outcome), several
# of one routing key to a message: its body is a JSON array of event objects of at most
# ``EVENTS_MESSAGE_BYTES`` (``pack_events``) and its ``type`` is ``EVENTS_TYPE`` (at most
# ``EVENTS_PER_MESSAGE`` events). Its AMQP ``user_id`` is the user the SDK connected as: RabbitMQ
# refuses a message naming another user, so the dispatcher knows who published each event (and,
# told which users may report on which jobs, ignores the others). A message of ``EVENT_TYPE``
# holds one event object, as SDKs before the arrays sent; the dispatcher reads both. Every
# dispatcher node consumes the one shared quorum queue ``EVENTS_QUEUE`` (bound with ``#``:
# competing consumers) and records the events; delivery is at-least-once, so each event carries a
# unique ``event_id`` and is recorded once whatever the number of copies.
#
# An event object (JSON): ``event_id``, ``job_id``, ``routing_key`` (the job's own), ``group``,
# ``consumer``, ``attempt`` (1 for the first delivery), ``outcome`` (one of ``OUTCOMES``),
# ``error`` (exception type and message, at most ``EVENT_ERROR_LIMIT`` characters, or null),
# ``at`` (RFC 3339 UTC, microseconds) and ``round``: the delivery's ``HEADER_ROUND``, or null when
# it had none.
#
# Anyone allowed to write to the exchange can publish an event, and a job may be dispatched again
# (an admin requeue): the dispatcher counts only an event that echoes the job's current round and
# names its routing key. Others are kept in its history, marked ignored, and change nothing. The
# round travels with the message, so only a consumer that received this dispatch knows it.

EVENTS_EXCHANGE: Final = "dispatcher.events"
EVENTS_QUEUE: Final = "dispatcher.events"
EVENT_TYPE: Final = "dispatcher.job-event"  # the ``type`` of a message holding one event
EVENTS_TYPE: Final = "dispatcher.job-events"  # the ``type`` of a message holding an array
EVENTS_PER_MESSAGE: Final = 1000  # a longer array is refused whole
# The SDK's messages stay within this; the dispatcher reads up to its
# DISPATCHER_EVENTS_MAX_MESSAGE_BYTES (256 KiB by default) and drops larger ones unread.
EVENTS_MESSAGE_BYTES: Final = 64 * 1024
OUTCOMES: Final = ("started", "succeeded", "failed", "dead")
# The outcomes that settle a job: the dispatcher's SQL spells them (a test holds it to these).
FINAL_OUTCOMES: Final = ("succeeded", "dead")
EVENT_ERROR_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEvent:
    """One step of one attempt, as a consumer saw it."""

    event_id: str
    job_id: str
    routing_key: str
    group: str
    consumer: str
    attempt: int
    outcome: str
    error: str | None
    at: datetime
    dispatch_round: str | None = None  # "round" in JSON: the dispatch the event reports on


def _event_object(event: JobEvent) -> dict[str, object]:
    return {
        "event_id": event.event_id,
        "job_id": event.job_id,
        "routing_key": event.routing_key,
        "group": event.group,
        "consumer": event.consumer,
        "attempt": event.attempt,
        "outcome": event.outcome,
        "error": event.error[:EVENT_ERROR_LIMIT] if event.error is not None else None,
        "at": event.at.astimezone(UTC).isoformat(),  # microseconds: steps of one attempt
        "round": event.dispatch_round,
    }


def encode_event(event: JobEvent) -> bytes:
    """One event's JSON body (the message of an SDK before the arrays)."""
    return orjson.dumps(_event_object(event))


def encode_events(events: Sequence[JobEvent]) -> bytes:
    """The body of an ``EVENTS_TYPE`` message: the events as a JSON array."""
    if not 0 < len(events) <= EVENTS_PER_MESSAGE:
        raise ValueError(f"1 to {EVENTS_PER_MESSAGE} events per message, not {len(events)}")
    return orjson.dumps([_event_object(event) for event in events])


def pack_events(
    events: Sequence[JobEvent], max_bytes: int = EVENTS_MESSAGE_BYTES
) -> list[tuple[list[JobEvent], bytes]]:
    """The events, in order, as the bodies of ``EVENTS_TYPE`` messages of at most ``max_bytes``
    and ``EVENTS_PER_MESSAGE`` events each, with the events each holds. Each body is
    ``encode_events`` of its events, built from each event encoded once (an event larger than
    ``max_bytes`` alone, which a consumer's own long group name could make, goes alone)."""
    packed: list[tuple[list[JobEvent], bytes]] = []
    chunk: list[JobEvent] = []
    parts: list[bytes] = []
    size = 2  # the brackets
    for event in events:
        part = orjson.dumps(_event_object(event))
        grown = size + len(part) + (1 if parts else 0)  # a comma between two
        if parts and (grown > max_bytes or len(parts) == EVENTS_PER_MESSAGE):
            packed.append((chunk, b"[" + b",".join(parts) + b"]"))
            chunk, parts, grown = [], [], 2 + len(part)
        chunk.append(event)
        parts.append(part)
        size = grown
    if parts:
        packed.append((chunk, b"[" + b",".join(parts) + b"]"))
    return packed


def _text(value: object, limit: int = 255) -> str:
    # PostgreSQL text cannot hold U+0000, and an exception message may carry one.
    return str(value).replace("\x00", "\ufffd")[:limit]


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uuid_text(value: object) -> str:
    """A UUID's canonical text; ValueError or TypeError for anything else. What an SDK sends is
    canonical already, and matched without making a UUID of it (events arrive by thousands a
    second)."""
    if not isinstance(value, str):
        raise TypeError(f"{type(value).__name__}, not a UUID's text")
    if _CANONICAL_UUID.fullmatch(value):
        return value
    return str(uuid.UUID(value))  # any other spelling it accepts


def _event_from(data: object) -> JobEvent:
    """The event a decoded JSON object holds; ValueError for anything else. Text is cut to its
    limit and NUL characters are replaced, so whatever a consumer sent can be stored."""
    if not isinstance(data, dict):
        raise ValueError(f"not a job event: {type(data).__name__}, not an object")
    try:
        event = JobEvent(
            event_id=_uuid_text(data["event_id"]),
            job_id=_uuid_text(data["job_id"]),
            routing_key=_text(data["routing_key"]),
            group=_text(data["group"]),
            consumer=_text(data["consumer"]),
            attempt=int(data["attempt"]),
            outcome=str(data["outcome"]),
            error=None if data.get("error") is None else _text(data["error"], EVENT_ERROR_LIMIT),
            at=parse_run_at(str(data["at"])),
            dispatch_round=None if data.get("round") is None else _uuid_text(data["round"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a job event: {exc!r}") from exc
    if event.outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {event.outcome!r}")
    if event.at.tzinfo is None:
        raise ValueError("event time without an offset")
    if not 0 <= event.attempt < 2**31:
        raise ValueError(f"attempt {event.attempt} out of range")
    return event


def _loads(body: bytes) -> object:
    # orjson refuses nesting past its limit with a ValueError, where json raised RecursionError.
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not a job event: {exc!r}") from exc


def decode_event(body: bytes) -> JobEvent:
    """Inverse of ``encode_event``; raises ValueError for anything else."""
    return _event_from(_loads(body))


def decode_events(body: bytes) -> list[JobEvent]:
    """The events of a message of either type (an array, or one object); ValueError when the
    body or any event in it is not one, or the array is empty or longer than
    ``EVENTS_PER_MESSAGE``."""
    data = _loads(body)
    if not isinstance(data, list):
        return [_event_from(data)]
    if not 0 < len(data) <= EVENTS_PER_MESSAGE:
        raise ValueError(f"1 to {EVENTS_PER_MESSAGE} events per message, not {len(data)}")
    return [_event_from(item) for item in data]


# --- per-job retry policy -----------------------------------------------------------------------
#
# A job may carry its own retry policy, which the SDK's consumer honours over its handler's
# ``max_attempts`` and ``backoff``: ``HEADER_MAX_ATTEMPTS`` (an integer, 1 to
# ``MAX_ATTEMPTS_LIMIT``: deliveries before the job is dead) and ``HEADER_RETRY_BACKOFF`` (the
# seconds to wait after each failed attempt, comma-separated, the last one repeated, e.g.
# ``"1,5,30"``; each 0 to ``RETRY_BACKOFF_MAX_S``, rounded up to a delay tier as any backoff).
# The dispatcher sets them from a job's ``max_attempts`` / ``retry_backoff_s`` fields (``enqueue``
# and the client take the same options); being ``x-retry-`` headers, producers cannot set them
# directly. A consumer ignores a value it cannot read (it keeps the handler's default).

HEADER_MAX_ATTEMPTS: Final = "x-retry-max-attempts"
HEADER_RETRY_BACKOFF: Final = "x-retry-backoff-s"
RETRY_POLICY_HEADERS: Final = (HEADER_MAX_ATTEMPTS, HEADER_RETRY_BACKOFF)
MAX_ATTEMPTS_LIMIT: Final = 100
RETRY_BACKOFF_MAX_STEPS: Final = 100
RETRY_BACKOFF_MAX_S: Final = 3600.0  # the longest default delay tier (``retry.DEFAULT_TIERS``)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """A job's own retry policy; None / empty where the handler's default applies."""

    max_attempts: int | None = None
    backoff_s: tuple[float, ...] = ()


def _seconds_text(seconds: float) -> str:
    millis = round(seconds, 3)
    return str(int(millis)) if millis == int(millis) else repr(millis)


def retry_policy_headers(
    *, max_attempts: int | None, backoff_s: Sequence[float] | None
) -> dict[str, HeaderValue]:
    """The headers carrying a (validated) policy; empty when the job has none."""
    headers: dict[str, HeaderValue] = {}
    if max_attempts is not None:
        headers[HEADER_MAX_ATTEMPTS] = max_attempts
    if backoff_s:
        headers[HEADER_RETRY_BACKOFF] = ",".join(_seconds_text(step) for step in backoff_s)
    return headers


def read_retry_policy(headers: Mapping[str, object]) -> RetryPolicy:
    """The policy a delivery carries; an unreadable or out-of-range value counts as absent."""
    raw = headers.get(HEADER_MAX_ATTEMPTS)
    text = _as_str(raw)
    if text is not None:  # published by hand as text
        raw = int(text) if text.isascii() and text.isdigit() else None
    max_attempts = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if max_attempts is not None and not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        max_attempts = None
    return RetryPolicy(max_attempts=max_attempts, backoff_s=_read_backoff(headers))


def _read_backoff(headers: Mapping[str, object]) -> tuple[float, ...]:
    text = _as_str(headers.get(HEADER_RETRY_BACKOFF))
    if not text:
        return ()
    try:
        steps = tuple(float(step) for step in text.split(","))
    except ValueError:
        return ()
    if len(steps) > RETRY_BACKOFF_MAX_STEPS or not all(
        0 <= step <= RETRY_BACKOFF_MAX_S
        for step in steps  # NaN fails both comparisons
    ):
        return ()
    return steps
