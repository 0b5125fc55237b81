"""One time source for every node: PostgreSQL's clock, read the way NTP reads a server's.

A sample is one round trip: the node's monotonic clock before and after, PostgreSQL's
``clock_timestamp()`` in between. PostgreSQL's clock was then at most half the round trip away
from the midpoint, so ``db - midpoint`` is the offset of PostgreSQL's clock from the monotonic
one, to within that half. Of the last ``WINDOW`` samples the ones with the shortest round trips
are believed (NTP's clock filter: a long round trip is one that waited in a queue somewhere), and
those within ``NEAR_BEST_S`` of the best are averaged, which smooths the jitter one sample has.
The node's time is then ``monotonic() + offset``: a step of the node's wall clock changes nothing,
and the wall clock is measured against it only to be reported, and bounded.

A sample far from the filter's estimate (further than both round trips allow) means a clock
stepped (the monotonic one under libfaketime, or PostgreSQL's after a failover to a server with
another clock): the older samples are dropped and the new one is believed.

Pure: the samples are handed in; ``timekeeper.py`` takes them.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

WINDOW = 8
# How fast a monotonic clock may drift from true time: an NTP-disciplined one well under 100 ppm
# (a crystal's worst without NTP is about 100 ppm): the estimate's error grows by this per second
# of age.
DRIFT_PER_S = 100e-6
# Two samples that disagree by more than their round trips allow, plus this, mean a step.
STEP_SLACK_S = 0.005
# Samples whose half round trip is within this of the best one's are averaged with it.
NEAR_BEST_S = 0.0002


class Sample(NamedTuple):
    sent: float  # monotonic seconds when the query left
    received: float  # monotonic seconds when its answer came
    db: float  # PostgreSQL's clock_timestamp(), POSIX seconds
    wall: float  # the node's wall clock at the midpoint, POSIX seconds

    @property
    def half_rtt(self) -> float:
        return max(0.0, self.received - self.sent) / 2

    @property
    def offset(self) -> float:
        """PostgreSQL's clock minus the monotonic one."""
        return self.db - (self.sent + self.received) / 2


class Estimate(NamedTuple):
    offset: float  # PostgreSQL's clock minus the monotonic one
    error: float  # bound on the offset's error when measured (the half round trips believed)
    at: float  # monotonic seconds of the sample it came from
    wall_offset: float  # the node's wall clock minus PostgreSQL's, at the latest sample

    def error_at(self, mono: float) -> float:
        return self.error + DRIFT_PER_S * max(0.0, mono - self.at)


class ClockFilter:
    def __init__(self, window: int = WINDOW) -> None:
        self._samples: deque[Sample] = deque(maxlen=window)
        self.steps = 0  # how many times a sample showed a clock had stepped

    def add(self, sample: Sample) -> None:
        best = self.estimate()
        if best is not None and _stepped(best, sample):
            self._samples.clear()
            self.steps += 1
        self._samples.append(sample)

    def estimate(self) -> Estimate | None:
        if not self._samples:
            return None
        best = min(sample.half_rtt for sample in self._samples)
        believed = [s for s in self._samples if s.half_rtt <= best + NEAR_BEST_S]
        offset = sum(sample.offset for sample in believed) / len(believed)
        # The wall clock from the latest sample, against the estimate: it may have stepped since
        # the samples believed (the monotonic clock, which the estimate is of, never does).
        latest = self._samples[-1]
        db_at_latest = (latest.sent + latest.received) / 2 + offset
        return Estimate(
            offset=offset,
            error=max(sample.half_rtt for sample in believed),
            at=min((s.sent + s.received) / 2 for s in believed),
            wall_offset=latest.wall - db_at_latest,
        )


def _stepped(best: Estimate, sample: Sample) -> bool:
    allowed = best.error_at(sample.received) + sample.half_rtt + STEP_SLACK_S
    return abs(sample.offset - best.offset) > allowed
