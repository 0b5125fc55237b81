"""ReadGate: the share of the database that reads on demand (a bulk action's count and sample)
may take, whatever their callers send. Pure: the caller passes the clock.

A read takes one of ``slots``; once it ends, its slot rests in proportion to what it took (at most
``duty`` of the slot's time is reading). Reads start at most ``rate_per_s`` a second, in bursts of
as many (a person's dry run and the action after it pass at once). A read asked for while no slot
is free, or past the rate, is refused at once with the seconds until one is: it never waits for
a connection of the pool, so claims, clock samples and probes always find one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dispatcher.timing.kinds import Mono


@dataclass(frozen=True, slots=True)
class Refused:
    """No slot is free for ``wait_s`` seconds (inf: every slot is reading, for how long no one
    knows)."""

    wait_s: float

    @property
    def retry_after_s(self) -> int:
        """When to ask again, in whole seconds (at least 1): a Retry-After."""
        return max(1, math.ceil(self.wait_s)) if math.isfinite(self.wait_s) else 1


class ReadGate:
    def __init__(self, *, slots: int, duty: float, rate_per_s: float, mono: Mono) -> None:
        if slots < 1 or not 0 < duty <= 1 or rate_per_s <= 0:
            raise ValueError("a read gate needs a slot, a duty in (0, 1] and a rate above 0")
        self._free_at = [0.0] * slots  # when each slot may start a read (inf: reading now)
        self._rest_per_s = (1.0 - duty) / duty
        self._rate_per_s = rate_per_s
        self._burst = max(1.0, rate_per_s)
        self._tokens = self._burst
        self._mono = mono
        self._filled_at = mono()

    def enter(self) -> int | Refused:
        """A slot for one read (give it back with ``leave``), or when to ask again."""
        now = self._mono()
        self._tokens = min(self._burst, self._tokens + (now - self._filled_at) * self._rate_per_s)
        self._filled_at = now
        soonest = min(self._free_at)
        if soonest > now:
            return Refused(soonest - now)
        if self._tokens < 1.0:
            return Refused((1.0 - self._tokens) / self._rate_per_s)
        self._tokens -= 1.0
        slot = self._free_at.index(soonest)
        self._free_at[slot] = math.inf
        return slot

    def leave(self, slot: int, *, took_s: float) -> None:
        """The read of ``slot`` ended after ``took_s`` seconds: the slot rests, then is free."""
        self._free_at[slot] = self._mono() + took_s * self._rest_per_s
