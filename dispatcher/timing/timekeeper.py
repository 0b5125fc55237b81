"""The node's time: PostgreSQL's clock, measured continuously over round trips (``timesource``).

Every node already shares PostgreSQL, so its clock is the one clock they all agree on. Firing, a
``delay_ms`` turned into a ``run_at``, expiry and the schedules all read ``now()``: the monotonic
clock plus the measured offset, so neither a wrong wall clock nor one stepped while the node runs
moves them. The wall clock is only measured against PostgreSQL's, to be reported and bounded.

Trust: the node fires only while the estimate exists, is still precise (its error, half a round
trip plus drift since it was measured, under ``MAX_ERROR_S``) and the wall clock is within
``max_offset_s`` of PostgreSQL's. A wall clock that far off means this host's time is broken
(NTP failed, a paused VM, a step by hand); the node then says so in ``/readyz`` rather than fire
on a host it cannot trust. Whatever this module believes, a claim is fenced by PostgreSQL's own
clock (``CLAIM_JOBS``): an error here can make a job late, never early.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from dispatcher import errors, metrics
from dispatcher.store.clock import ClockStore
from dispatcher.timing.kinds import Mono, Wall
from dispatcher.timing.timesource import ClockFilter, Estimate

logger = logging.getLogger(__name__)

# A sample a second: a clock stepped under the node (the monotonic one, as libfaketime can) is
# noticed within about that; the claim fence keeps anything from firing early meanwhile.
INTERVAL_S = 1.0
# Samples taken at start, in a burst, so that the first estimate has a short round trip to use.
FIRST_SAMPLES = 4
FIRST_GAP_S = 0.01
# A fence refusal asks for a sample now; one more within this is not taken.
RESYNC_GAP_S = 0.1
# Past this the estimate is too coarse to fire on (PostgreSQL out of reach for hours at 100 ppm,
# or answering in seconds).
MAX_ERROR_S = 0.5


class Timekeeper:
    def __init__(
        self,
        store: ClockStore,
        metrics: metrics.Metrics,
        *,
        max_offset_s: float,
        interval_s: float = INTERVAL_S,
        mono: Mono = time.monotonic,
        wall: Wall = time.time,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._max_offset_s = max_offset_s
        self._interval_s = interval_s
        self._mono = mono
        self._wall = wall
        self._filter = ClockFilter()
        self._estimate: Estimate | None = None
        self._sampled_at = float("-inf")
        self._sampling = asyncio.Lock()
        self._trusted = asyncio.Event()
        self._judged = False  # a distrust at start is logged once, then only changes
        self._reason: str | None = "PostgreSQL's clock not measured yet"
        metrics.clock_offset.set_function(self._wall_offset)
        metrics.clock_error.set_function(self.error_s)

    # --- the time -----------------------------------------------------------------------------

    def now(self) -> float:
        """POSIX seconds by PostgreSQL's clock. Before the first sample (the node's start takes
        them before anything runs) the wall clock, which nothing fires on: firing waits for
        ``trusted``."""
        estimate = self._estimate
        if estimate is None:
            return self._wall()
        return self._mono() + estimate.offset

    def now_dt(self) -> datetime:
        return datetime.fromtimestamp(self.now(), UTC)

    def error_s(self) -> float:
        """How far ``now`` may be from PostgreSQL's clock: half the round trip believed, and the
        drift since (before the first sample, nothing fires: 0)."""
        estimate = self._estimate
        return 0.0 if estimate is None else estimate.error_at(self._mono())

    # --- trust --------------------------------------------------------------------------------

    def distrust(self) -> str | None:
        """Why the node may not fire, judged now, or None."""
        estimate = self._estimate
        if estimate is None:
            return "PostgreSQL's clock not measured yet"
        error = estimate.error_at(self._mono())
        if error > MAX_ERROR_S:
            return f"PostgreSQL's clock known only to within {error:.3f} s (limit {MAX_ERROR_S} s)"
        if abs(estimate.wall_offset) > self._max_offset_s:
            side = "ahead of" if estimate.wall_offset > 0 else "behind"
            return (
                f"this host's clock is {abs(estimate.wall_offset):.3f} s {side} PostgreSQL's "
                f"(limit {self._max_offset_s} s): fix its time (NTP)"
            )
        return None

    def trusted(self) -> bool:
        """As judged at the last sample (or failed one): what firing goes by."""
        return self._trusted.is_set()

    async def wait_trusted(self) -> None:
        await self._trusted.wait()

    def describe(self) -> dict[str, object]:
        """For ``/readyz``: the measured offset of this host's clock, and whether it is trusted."""
        estimate = self._estimate
        reason = self._reason
        answer: dict[str, object] = {
            "trusted": reason is None,
            "offset_s": None if estimate is None else round(estimate.wall_offset, 6),
            "error_s": None if estimate is None else round(self.error_s(), 6),
            "max_offset_s": self._max_offset_s,
            "steps": self._filter.steps,
        }
        if reason is not None:
            answer["reason"] = reason
        return answer

    # --- sampling -----------------------------------------------------------------------------

    async def start(self) -> None:
        """The first estimate, from a burst of samples; raises what the store raises (the node's
        start retries while PostgreSQL is away)."""
        for number in range(FIRST_SAMPLES):
            if number:
                await asyncio.sleep(FIRST_GAP_S)
            await self._sample()

    async def run(self) -> None:
        """A sample every interval. A failed one is logged and the estimate ages (its error
        grows); the loop carries on: the supervisor is for what is not PostgreSQL being away."""
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self._sample()
            except errors.StoreUnavailable as exc:
                logger.debug("clock sample failed: %s", exc, extra={"action": "clock"})
                self._judge()

    async def resync(self) -> None:
        """Sample now (a claim was fenced: this node's idea of the time may be wrong), unless a
        sample was taken in the last ``RESYNC_GAP_S``."""
        if 0 <= self._mono() - self._sampled_at < RESYNC_GAP_S:
            return  # (a monotonic clock stepped back under the node is measured at once)
        try:
            await self._sample()
        except errors.StoreUnavailable:
            return  # the claim that asked failed or will: the firer's backoff handles it

    async def _sample(self) -> None:
        async with self._sampling:
            sample = await self._store.sample(mono=self._mono, wall=self._wall)
            steps = self._filter.steps
            self._filter.add(sample)
            self._estimate = self._filter.estimate()
            self._sampled_at = sample.received
        if self._filter.steps != steps:
            self._metrics.clock_steps.inc()
            logger.warning(
                "a clock stepped: measuring PostgreSQL's again (this host's clock is %.3f s "
                "from it)",
                sample.wall - sample.db,
                extra={"action": "clock"},
            )
        self._judge()

    def _judge(self) -> None:
        """Trusted or not; logged when that changes (and a start that is not trusted)."""
        reason = self._reason = self.distrust()
        if reason is None:
            if not self._trusted.is_set():
                self._trusted.set()
                logger.info("clock trusted: %s", self.describe(), extra={"action": "clock"})
            return
        if self._trusted.is_set() or not self._judged:
            logger.error("firing stopped: %s", reason, extra={"action": "clock"})
        self._trusted.clear()
        self._judged = True

    def _wall_offset(self) -> float:
        return 0.0 if self._estimate is None else self._estimate.wall_offset
