"""Backoff and delay tiers. Pure: randomness comes from the caller's ``random.Random``."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

Backoff = Callable[[int], float]

# Wait-queue delays, in seconds: about 1 s to 1 h. A delay is rounded up to the next tier.
DEFAULT_TIERS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)


def exponential(
    base: float = 15.0, cap: float = 3600.0, *, rng: random.Random | None = None
) -> Backoff:
    """``attempt**4 + base + random(0, 30) * (attempt + 1)`` seconds, at most ``cap``.

    The jitter grows with the attempt so that jobs failing from one shared cause spread out
    instead of retrying in lockstep.
    """
    chance = rng or random.Random()

    def delay(attempt: int) -> float:
        return min(cap, attempt**4 + base + chance.uniform(0, 30) * (attempt + 1))

    return delay


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
