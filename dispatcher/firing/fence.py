"""When each claimed job may be published, on the monotonic clock (pure: ``firer.Firer`` passes
its readings). Never early, whatever the node's clock.

Two clocks may say a job is due: the claim's own reading of PostgreSQL's clock, carried from when
its answer was read (late by the round trip and any event-loop delay, never early: the fallback);
and the node's time as the claim was sent, less its error (sooner, as a rule). The node's time is
not believed when it was ahead of the claim's reading beyond its error by more than
``CLOCK_CHECK_S``, or moved otherwise than the monotonic clock while the claim ran (a step): then
the reading alone decides.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

# How far the node's time may run ahead of the claim's own reading of PostgreSQL's clock, beyond
# its error, before that reading decides when the claimed jobs are published.
CLOCK_CHECK_S = 0.002


@dataclass(frozen=True, slots=True, kw_only=True)
class Readings:
    """The clocks around one claim: the node's time (``*_s``, POSIX seconds by PostgreSQL's clock
    as the node measures it) and the monotonic clock (``*_mono``) as the claim was sent and as its
    answer was read; PostgreSQL's clock as the claim answered; the node's time's error."""

    sent_s: float
    sent_mono: float
    read_s: float
    read_mono: float
    answered_at_s: float
    error_s: float

    @property
    def ahead_s(self) -> float:
        """How far the node's time was ahead of the claim's reading, beyond its error."""
        return self.sent_s - self.answered_at_s - self.error_s

    @property
    def moved_s(self) -> float:
        """How far the node's time moved otherwise than the monotonic clock during the claim."""
        return (self.read_s - self.sent_s) - (self.read_mono - self.sent_mono)

    @property
    def believed(self) -> bool:
        """Whether the node's time may decide (else the claim's reading alone does)."""
        return self.ahead_s <= CLOCK_CHECK_S and abs(self.moved_s) <= CLOCK_CHECK_S


def due_mono(run_at_s: Sequence[float], readings: Readings) -> list[float]:
    """When each job (of these run_at, in the order they go) may be published, on the monotonic
    clock: the sooner of the two clocks' (the claim's reading alone when the node's time is not
    believed), and never before the one before it (a caller bisects them)."""
    by_claim = readings.read_mono - readings.answered_at_s
    due = [by_claim + at for at in run_at_s]
    if readings.believed:
        by_node = readings.sent_mono + readings.error_s - readings.sent_s
        due = [min(at, by_node + run_at) for at, run_at in zip(due, run_at_s, strict=True)]
    return list(itertools.accumulate(due, max))
