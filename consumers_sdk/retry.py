"""Backoff, delay tiers and what follows a failed attempt. Pure: randomness comes from the
caller's ``random.Random``."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence

from consumers_sdk import contract

Backoff = Callable[[int], float]

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
