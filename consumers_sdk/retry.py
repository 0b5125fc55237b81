"""Backoff, delay tiers and what follows a failed attempt, and ``Doubling``: the pauses between
tries of a connection or a request that keeps failing. Pure: randomness comes from the caller's
``random.Random``."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from consumers_sdk import contract

Backoff = Callable[[int], float]

# Past this many doublings every pause is the cap (and 2**n stays a float).
_MAX_DOUBLINGS = 64

# Wait-queue delays, in seconds: about 1 s to 1 h. A delay is rounded up to the next tier.
DEFAULT_TIERS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)


def polynomial(
    base: float = 15.0, cap: float = 3600.0, *, rng: random.Random | None = None
) -> Backoff:
    """``attempt**4 + base + random(0, 30) * (attempt + 1)`` seconds, at most ``cap``.

    A polynomial in the attempt (Sidekiq's curve), not an exponential: 16 s, 31 s, 96 s, 271 s
    before the jitter. The jitter grows with the attempt so that jobs failing from one shared
    cause spread out instead of retrying in lockstep.
    """
    chance = rng or random.Random()

    def delay(attempt: int) -> float:
        return min(cap, attempt**4 + base + chance.uniform(0, 30) * (attempt + 1))

    return delay


def exponential(
    base: float = 15.0, cap: float = 3600.0, *, rng: random.Random | None = None
) -> Backoff:
    """Deprecated: the same backoff as ``polynomial``, under a name that misdescribed it."""
    warnings.warn(
        "consumers_sdk.exponential() is deprecated: it is polynomial(), the same backoff under "
        "the name that says what it computes",
        DeprecationWarning,
        stacklevel=2,
    )
    return polynomial(base, cap, rng=rng)


def tier_for(delay_s: float, tiers: Sequence[float]) -> float:
    """The smallest tier at least ``delay_s`` long (the longest tier for anything longer)."""
    ordered = sorted(tiers)
    for tier in ordered:
        if tier >= delay_s:
            return tier
    return ordered[-1]


def validate_tiers(tiers: Sequence[float]) -> tuple[float, ...]:
    """Sorted, in whole milliseconds (a wait queue's TTL and name are in ms), without repeats."""
    if not tiers or any(not math.isfinite(t) or t < 0.001 for t in tiers):
        raise ValueError("retry_tiers must be numbers of seconds, each at least 0.001")
    return tuple(sorted({round(t, 3) for t in tiers}))


def next_delay(
    attempt: int,
    *,
    max_attempts: int,
    backoff: Backoff,
    policy: contract.RetryPolicy,
    requested_s: float | None = None,
) -> float | None:
    """Seconds to wait after failed ``attempt`` before the next one, or None: the job is dead.

    The job's own policy (its ``x-retry-`` headers) wins over the handler's ``max_attempts`` and
    ``backoff``; a ``Retry(delay=)`` the handler raised (``requested_s``) wins over both backoffs.
    A policy backoff gives the delay after attempt n as its n-th step, the last one repeated.
    """
    if attempt >= (policy.max_attempts or max_attempts):
        return None
    if requested_s is not None:
        return requested_s
    if policy.backoff_s:
        return policy.backoff_s[min(attempt, len(policy.backoff_s)) - 1]
    return backoff(attempt)


@dataclass(slots=True)
class Doubling:
    """Pauses between tries of one thing that keeps failing (a connection, a request the
    dispatcher answered 503): ``first_s`` after the first failure, doubling up to ``max_s``;
    ``reset`` after a success. With ``rng`` each pause is stretched by a random 0 to 100 %, so
    that clients failing together do not come back in step. Every reconnecting loop of the SDK
    paces itself with one (a handler's ``Backoff`` is another thing: a job's retry delays)."""

    first_s: float
    max_s: float
    rng: random.Random | None = None
    failures: int = 0  # in a row, since the last reset

    def next(self) -> float:
        """Count one more failure: the pause to wait after it."""
        self.failures += 1
        doublings = min(self.failures - 1, _MAX_DOUBLINGS)
        pause = min(self.first_s * 2.0**doublings, self.max_s)
        return pause if self.rng is None else pause * (1 + self.rng.random())

    def reset(self) -> None:
        self.failures = 0
