"""What one attempt of a handler comes to: run it under its timeout, then decide from its result
whether the delivery is acked, retried after which delay, or dead with which reason.

No AMQP: ``delivery.py`` settles the broker message as decided here, and ``consumers_sdk.testing``
runs handlers through the same two functions, so a test sees the consumer's own rules.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from consumers_sdk import contract, retry
from consumers_sdk import job as job_mod
from consumers_sdk.errors import HandlerTimeout, Reject, Retry

ERROR_TEXT_LIMIT = 1000

Handler = Callable[[job_mod.Job], Awaitable[None] | None]
Kind = Literal["acked", "retried", "dead"]


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler and its rules (``Consumer.handler``'s arguments)."""

    routing_key: str
    queue: str
    function: Handler
    max_attempts: int
    timeout_s: float
    backoff: retry.Backoff


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What became of one delivery.

    ``kind`` is ``"acked"`` (the handler returned), ``"retried"`` (it failed and the job waits
    ``delay_s``, rounded up to the wait queue of ``tier_s``) or ``"dead"`` (``Reject``, or its
    attempts are spent: parked in ``.dead``). ``reason`` is the error as the job's headers record
    it (``x-retry-last-error``, ``x-dead-error``); ``timed_out`` says the handler ran past its
    ``timeout``, which counts as a failed attempt like any other.
    """

    kind: Kind
    attempt: int
    delay_s: float | None = None
    tier_s: float | None = None
    reason: str | None = None
    timed_out: bool = False
    error: BaseException | None = field(default=None, compare=False)


async def handle(spec: HandlerSpec, job: job_mod.Job, *, tiers: Sequence[float]) -> Outcome:
    """Run the handler on the job once and decide what its result means."""
    error = await run_once(spec.function, job, timeout_s=spec.timeout_s)
    return decide(
        error,
        attempt=job.attempt,
        headers=job.message.headers or {},
        max_attempts=spec.max_attempts,
        backoff=spec.backoff,
        tiers=tiers,
    )


async def run_once(function: Handler, job: job_mod.Job, *, timeout_s: float) -> Exception | None:
    """Run the handler once; the exception it raised (``HandlerTimeout`` when it ran past
    ``timeout_s``), or None when it returned. A sync handler runs in a thread: past its timeout
    it counts as failed, but its thread runs on to the end."""
    timer = asyncio.timeout(timeout_s)
    try:
        async with timer:
            if inspect.iscoroutinefunction(function):
                await function(job)
            else:
                await asyncio.to_thread(function, job)  # never block the loop
    except Exception as exc:  # any handler failure, a timeout included, is a failed attempt
        if timer.expired() and not isinstance(exc, Reject | Retry):
            return HandlerTimeout(f"handler ran past its timeout of {timeout_s}s")
        return exc
    return None


def decide(
    error: Exception | None,
    *,
    attempt: int,
    headers: Mapping[str, object],
    max_attempts: int,
    backoff: retry.Backoff,
    tiers: Sequence[float],
) -> Outcome:
    """The outcome of failed (or not) ``attempt`` of a delivery carrying ``headers``: a job's own
    retry policy (its ``x-retry-`` headers) wins over the handler's ``max_attempts`` and
    ``backoff``, and ``Retry(delay=)`` over both backoffs, never over the attempts."""
    if error is None:
        return Outcome(kind="acked", attempt=attempt)
    reason = error_text(error)
    timed_out = isinstance(error, HandlerTimeout)
    if isinstance(error, Reject):
        return Outcome(kind="dead", attempt=attempt, reason=reason, error=error)
    delay_s = retry.next_delay(
        attempt,
        max_attempts=max_attempts,
        backoff=backoff,
        policy=contract.read_retry_policy(headers),
        requested_s=error.delay_s if isinstance(error, Retry) else None,
    )
    if delay_s is None:
        return Outcome(
            kind="dead", attempt=attempt, reason=reason, timed_out=timed_out, error=error
        )
    return Outcome(
        kind="retried",
        attempt=attempt,
        delay_s=delay_s,
        tier_s=retry.tier_for(delay_s, tiers),
        reason=reason,
        timed_out=timed_out,
        error=error,
    )


def error_text(error: BaseException) -> str:
    """Exception type and message, truncated to ``ERROR_TEXT_LIMIT`` characters."""
    return f"{type(error).__name__}: {error}"[:ERROR_TEXT_LIMIT]
