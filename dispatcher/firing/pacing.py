"""A token bucket for the catch-up lane: overdue jobs drain at most ``rate`` per second, so an
outage's backlog does not flood RabbitMQ and the consumers. Pure: the clock is passed in."""

from __future__ import annotations

import math

CHUNKS_PER_S = 20  # hand out tokens in chunks: a firing batch of one job each wake-up is waste


class Pace:
    """``rate`` <= 0 means unlimited."""

    def __init__(self, rate: float, *, batch: int) -> None:
        self.rate = rate
        self._capacity = max(1.0, min(float(batch), rate)) if rate > 0 else math.inf
        self._chunk = max(1.0, min(float(batch), rate / CHUNKS_PER_S)) if rate > 0 else 1.0
        self._tokens = self._capacity if rate > 0 else math.inf
        self._at_s: float | None = None

    def take(self, now_s: float, wanted: int) -> int:
        """How many of ``wanted`` may go now; they are spent."""
        if self.rate <= 0:
            return wanted
        self._refill(now_s)
        granted = min(wanted, int(self._tokens))
        self._tokens -= granted
        return granted

    def wait_s(self, now_s: float, wanted: int) -> float:
        """How long until a chunk of ``wanted`` (or all of it, if smaller) may go."""
        if self.rate <= 0:
            return 0.0
        self._refill(now_s)
        need = min(float(wanted), self._chunk)
        return max(0.0, (need - self._tokens) / self.rate)

    def _refill(self, now_s: float) -> None:
        if self._at_s is not None:
            self._tokens = min(self._capacity, self._tokens + (now_s - self._at_s) * self.rate)
        self._at_s = now_s
