"""The node's standing (``health``): probed, judged, reported to the cluster, logged.

A round trip to PostgreSQL and one to RabbitMQ every ``PROBE_S``, each bounded by
``PROBE_TIMEOUT_S``, on the same pool and connection firing uses: a path that drops packets
shows here within seconds, whatever the TCP and heartbeat timeouts. The clock counts as failing
while the timekeeper does not trust it. The standing is judged every ``JUDGE_S`` and handed to
ownership: in a cluster, a node that stepped out gets no shards while other nodes are well.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from dispatcher import metrics
from dispatcher.cluster.ownership import Ownership
from dispatcher.health import Health, Service, Standing
from dispatcher.timing.kinds import Mono

logger = logging.getLogger(__name__)

PROBE_S = 1.0
PROBE_TIMEOUT_S = 2.0
PROBE_GRACE_S = 0.5
# A probe not answered by then makes the node FAILING (``Health.slow``): every node hears of a
# failure they all share before any of them can step out.
SLOW_S = 0.5
JUDGE_S = 0.25

Probe = Callable[[float], Awaitable[str | None]]  # timeout -> None, or why it failed


class Steward:
    def __init__(
        self,
        health: Health,
        ownership: Ownership,
        metrics: metrics.Metrics,
        *,
        probes: dict[Service, Probe],
        distrust_clock: Callable[[], str | None],
        mono: Mono = time.monotonic,
    ) -> None:
        self._health = health
        self._ownership = ownership
        self._metrics = metrics
        self._probes = probes
        self._distrust_clock = distrust_clock
        self._mono = mono
        metrics.standing.set_function(lambda: _LEVEL[self._health.standing])

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for service, probe in self._probes.items():
                group.create_task(self._probe(service, probe), name=f"probe-{service}")
            group.create_task(self._judge(), name="standing")

    def describe(self) -> dict[str, object]:
        return self._health.describe(self._mono())

    def reason(self) -> str | None:
        return self._health.reason(self._mono())

    def standing(self) -> Standing:
        return self._health.standing

    async def _probe(self, service: Service, probe: Probe) -> None:
        while True:
            began = self._mono()
            attempt = asyncio.ensure_future(probe(PROBE_TIMEOUT_S))
            await asyncio.wait({attempt}, timeout=SLOW_S)
            if not attempt.done():
                self._health.slow(service, began)
            # A probe overrunning its own timeout (a driver's cleanup on a connection that went
            # dead) counts as failed at once; the next waits for it to end.
            await asyncio.wait({attempt}, timeout=PROBE_TIMEOUT_S + PROBE_GRACE_S - SLOW_S)
            if not attempt.done():
                self._health.failed(service, f"no answer in {PROBE_TIMEOUT_S:g} s", began)
            failure = await attempt
            if failure is None:
                self._health.ok(service, self._mono())
            else:
                self._health.failed(service, failure, began)
            await asyncio.sleep(max(0.0, began + PROBE_S - self._mono()))

    def answering(self, service: Service) -> bool:
        """Whether SERVICE is not failing: ``/readyz``'s check, with no round trip of its own
        (one on a dead connection would hold the answer up). A probe that does not come back
        counts as failed after ``PROBE_TIMEOUT_S`` + ``PROBE_GRACE_S``, so this cannot go stale."""
        return service not in self._health.failing(self._mono())

    async def _judge(self) -> None:
        while True:
            now = self._mono()
            distrust = self._distrust_clock()
            if distrust is None:
                self._health.ok(Service.CLOCK, now)
            else:
                self._health.failed(Service.CLOCK, distrust, now)
            before = self._health.standing
            standing = self._health.judge(now, holds_shards=bool(self._ownership.epochs()))
            if standing is not before:
                self._log(before, standing, now)
            await self._ownership.report(None if standing is Standing.OK else standing.value)
            await asyncio.sleep(JUDGE_S)

    def _log(self, before: Standing, standing: Standing, now: float) -> None:
        if standing is Standing.OUT:
            self._metrics.step_outs.inc()
        reason = self._health.reason(now)
        level = logging.INFO if standing in (Standing.OK, Standing.RECOVERING) else logging.WARNING
        logger.log(
            level,
            "standing %s -> %s%s",
            before.value,
            standing.value,
            f": {reason}" if reason else "",
            extra={"action": "standing"},
        )


_LEVEL = {Standing.OK: 0, Standing.FAILING: 1, Standing.OUT: 2, Standing.RECOVERING: 3}
