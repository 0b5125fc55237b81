"""What a job may be: the limits and checks that both the dispatcher's HTTP API and ``enqueue``
apply, defined once. Pure. Each check returns what is wrong (None when nothing is) and each side
raises its own error: the API a 4xx naming the field, ``enqueue`` a ValueError or TypeError."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, get_args

from consumers_sdk import contract

# A namespace: an API key's, a flow rule's, a bulk filter's (fullmatch: "$" would admit a final
# newline).
NAMESPACE: Final = re.compile(r"[A-Za-z0-9_\-]{1,64}")
MAX_PRIORITY: Final = 9  # a job's priority is 0 to this, as AMQP 0-9-1 numbers them
# Topic-exchange words: no wildcards (a job is published, not bound), no empty words.
ROUTING_KEY: Final = re.compile(r"^[A-Za-z0-9_\-:]+(\.[A-Za-z0-9_\-:]+)*$")
AMQP_SHORTSTR_BYTES: Final = 255
INT64_MAX: Final = 2**63 - 1  # PostgreSQL bigint, AMQP long-long, orjson: no integer may exceed it
# What the rest of the pipeline can carry, so that every job accepted can be published:
MAX_TTL_MS: Final = 2**32 - 1  # RabbitMQ refuses a message expiration above this
EARLIEST_DUE: Final = datetime(1970, 1, 1, tzinfo=UTC)
# Float header values travel as AMQP 32-bit floats (pamqp's encoding): about 7 significant
# digits, and nothing larger than this.
FLOAT32_MAX: Final = 3.4028234663852886e38
# RabbitMQ 4's default max_message_size is 16 MiB and a bigger message closes the channel: the
# payload limit stays below it, leaving room for the headers.
MAX_PAYLOAD_BYTES_CEILING: Final = 15 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The configurable limits; the defaults are the dispatcher's (``DISPATCHER_MAX_*``)."""

    max_payload_bytes: int = 256 * 1024
    max_headers: int = 32
    max_header_bytes: int = 1024
    max_routing_key_bytes: int = AMQP_SHORTSTR_BYTES
    max_idempotency_key_length: int = 255
    max_delay_days: int = 3660


DEFAULT_LIMITS: Final = Limits()


@functools.lru_cache(maxsize=4096)  # a batch's jobs share a few keys: checked once each
def routing_key_problem(value: str, max_bytes: int = AMQP_SHORTSTR_BYTES) -> str | None:
    if not ROUTING_KEY.fullmatch(value):  # match would admit a final newline
        return "must be dot-separated words of letters, digits, '_', '-' or ':' (no wildcards)"
    if len(value.encode()) > max_bytes:
        return f"must be at most {max_bytes} bytes"
    return None


def namespace_problem(value: str) -> str | None:
    """What is wrong with a namespace: the node's keys, limits and bulk actions, and the SDK's
    fake, refuse one with this message."""
    return None if NAMESPACE.fullmatch(value) else "a namespace is 1-64 letters, digits, '_' or '-'"


def priority_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        return f"must be an integer from 0 to {MAX_PRIORITY}"
    return None


def prefix_words(prefix: str) -> tuple[str, str | None]:
    """A routing-key prefix as the whole words it names (``billing.`` is ``billing``), and what
    is wrong with them as a routing key, if anything: the node's ``routing_key_prefix`` and the
    SDK's fake check it with this one function."""
    words = prefix.rstrip(".")
    return words, routing_key_problem(words)


def unstorable(text: str) -> str | None:
    """Why PostgreSQL could not store this text (it holds no NUL, UTF-8 no lone surrogate)."""
    if "\x00" in text:
        return "must not contain NUL characters"
    try:
        text.encode()
    except UnicodeEncodeError:
        return "must be valid Unicode (no lone surrogates)"
    return None


def header_name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "header names must be non-empty strings"
    if (problem := unstorable(name)) is not None:
        return f"header names {problem}"
    return contract.header_name_problem(name)


def header_value_problem(value: object) -> str | None:
    """A value AMQP and PostgreSQL's JSON can both hold: a string, a 64-bit integer, a finite
    float within the 32-bit range, or a boolean."""
    if isinstance(value, str):
        return unstorable(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -INT64_MAX - 1 <= value <= INT64_MAX else "integers must fit in 64 bits"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "must be a finite number"
        if abs(value) > FLOAT32_MAX:
            return "floats must be within ±3.4e38 (AMQP carries them as 32-bit floats)"
        return None
    return "must be a string, an integer, a float or a boolean"


def headers_problem(headers: Mapping[str, object], limits: Limits) -> tuple[str, str] | None:
    """(field, what is wrong) for the first header the dispatcher would refuse; field is
    ``headers`` (their number, a name that is not a string) or ``headers.<name>``."""
    if len(headers) > limits.max_headers:
        return "headers", f"at most {limits.max_headers} headers"
    for name, value in headers.items():
        if problem := header_name_problem(name):
            return f"headers.{name}" if isinstance(name, str) and name else "headers", problem
        problem = header_value_problem(value)
        if problem:
            return f"headers.{name}", problem
        if len(name.encode()) + len(str(value).encode()) > limits.max_header_bytes:
            return f"headers.{name}", f"name and value must fit in {limits.max_header_bytes} bytes"
    return None


def due_problem(due: datetime, now: datetime, limits: Limits) -> str | None:
    """A due time is at most ``max_delay_days`` ahead. One in the past means "as soon as
    possible" (overdue jobs fire oldest first), back to the POSIX epoch, where the scheduler's
    scans of overdue jobs begin: an older one would only be found by the safety sweep."""
    if due < EARLIEST_DUE:
        return "must not be before 1970-01-01T00:00:00Z"
    if due - now > timedelta(days=limits.max_delay_days):
        return f"must be within {limits.max_delay_days} days from now"
    return None


def ttl_ms_problem(ttl_ms: int) -> str | None:
    if not 1 <= ttl_ms <= MAX_TTL_MS:
        return f"must be between 1 and {MAX_TTL_MS} ms (RabbitMQ's longest message expiration)"
    return None


# The keys of a schedule's occurrences (``dispatcher.recurring.occurrences.idempotency_key``):
# a producer that took one first would have the occurrence dropped as its duplicate.
SCHEDULE_KEY_PREFIX: Final = "schedule:"


def idempotency_key_problem(value: str, limits: Limits) -> str | None:
    if not value:
        return "must not be empty"
    if value.startswith(SCHEDULE_KEY_PREFIX):
        return f"must not start with {SCHEDULE_KEY_PREFIX!r} (the keys of schedules' occurrences)"
    if len(value) > limits.max_idempotency_key_length:
        return f"must be at most {limits.max_idempotency_key_length} characters"
    return unstorable(value)


def max_attempts_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be an integer"
    if not 1 <= value <= contract.MAX_ATTEMPTS_LIMIT:
        return f"must be between 1 and {contract.MAX_ATTEMPTS_LIMIT}"
    return None


def retry_backoff_problem(seconds: list[float]) -> tuple[str, str] | None:
    """(index suffix, what is wrong): ``""`` for the list, ``"[i]"`` for one step."""
    if not 1 <= len(seconds) <= contract.RETRY_BACKOFF_MAX_STEPS:
        return "", f"must hold 1 to {contract.RETRY_BACKOFF_MAX_STEPS} delays"
    for index, step in enumerate(seconds):
        if not math.isfinite(step) or not 0 <= step <= contract.RETRY_BACKOFF_MAX_S:
            return f"[{index}]", f"must be between 0 and {contract.RETRY_BACKOFF_MAX_S:g} seconds"
    return None


# What a submit does when its idempotency key names a job already, and when a job lets go of its
# key (``dispatcher.models.OnExisting`` and ``KeyRelease``; a unit test holds them equal). The
# first of each is the default, today's behaviour: keep the job, hold the key while it is stored.
OnExisting = Literal["keep", "replace", "extend"]
KeyRelease = Literal["never", "dispatched", "finished"]
ON_EXISTING: Final[tuple[str, ...]] = get_args(OnExisting)
KEY_RELEASES: Final[tuple[str, ...]] = get_args(KeyRelease)


def key_levers_problem(
    idempotency_key: str | None, on_existing: object, release_key: object
) -> tuple[str, str] | None:
    """(field, what is wrong) of ``on_existing`` and ``release_key``: a known value, and one
    other than the default only with an idempotency key (there is no job to find, or key to let
    go of, without one)."""
    if on_existing not in ON_EXISTING:
        return "on_existing", "must be keep, replace or extend"
    if release_key not in KEY_RELEASES:
        return "release_key", "must be never, dispatched or finished"
    if idempotency_key is None:
        if on_existing != ON_EXISTING[0]:
            return "on_existing", "needs an idempotency_key"
        if release_key != KEY_RELEASES[0]:
            return "release_key", "needs an idempotency_key"
    return None
