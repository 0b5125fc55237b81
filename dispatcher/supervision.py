"""Supervision: every background loop of a node runs under ``Supervisor.supervise``.

A loop whose body returns has ended (a drained firer, a publisher that connected). A body that
raises is run again after a backoff, whatever it raised, and shows as degraded in ``/readyz``
until its new run has lasted ``HEALTHY_AFTER_S``:

    running --raises--> degraded (backoff: 0.5 s doubling to 30 s) --runs again--> running
    running/degraded --lasted HEALTHY_AFTER_S--> healthy (the backoff starts over)

Failures the services cause (``errors.TRANSIENT``: PostgreSQL, RabbitMQ or ZooKeeper not there)
are logged in a line; anything else is a bug or a poison input and is logged with its traceback.
Both are counted by loop and kind. Only ``errors.Fatal`` (what cannot heal: a shard-count
mismatch, a schema newer than the code) leaves the loop, and with it the node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dispatcher import errors, metrics

logger = logging.getLogger(__name__)

HEALTHY_AFTER_S = 5.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
CANCEL_AGAIN_S = 1.0


@dataclass(slots=True)
class LoopState:
    """What ``/readyz`` shows of one loop."""

    failures: int = 0  # in a row, since it last ran HEALTHY_AFTER_S
    degraded: bool = False
    last_error: str | None = None


async def _stopped(run: asyncio.Future[None]) -> None:
    """Cancel ``run`` and wait for it to end, cancelling again every ``CANCEL_AGAIN_S``: a body
    can swallow one cancellation (aiormq closes the channel of a cancelled call and carries on),
    and a node must still stop."""
    while not run.done():
        run.cancel()
        await asyncio.wait({run}, timeout=CANCEL_AGAIN_S)


def backoff_s(failures: int) -> float:
    """The pause after the ``failures``-th failure in a row (1, 2, ...)."""
    return float(min(FIRST_BACKOFF_S * 2 ** max(failures - 1, 0), MAX_BACKOFF_S))


class Supervisor:
    def __init__(
        self, metrics: metrics.Metrics, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._closing = asyncio.Event()
        self.loops: dict[str, LoopState] = {}

    def close(self) -> None:
        """No loop is restarted from now on: the node is stopping."""
        self._closing.set()

    def degraded(self) -> dict[str, str]:
        """The loops failing now, with their last error."""
        return {
            name: state.last_error or "failing"
            for name, state in self.loops.items()
            if state.degraded
        }

    async def supervise(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` until it returns, restarting it after every failure but a fatal one."""
        state = self.loops.setdefault(name, LoopState())
        self._metrics.loop_degraded.labels(loop=name).set(0)
        while True:
            run = asyncio.ensure_future(body())
            try:
                done, _ = await asyncio.wait({run}, timeout=HEALTHY_AFTER_S)
                if not done:
                    self._healthy(name, state)
                await run
                return
            except asyncio.CancelledError:
                await _stopped(run)  # its own cleanup runs before the node goes on
                raise
            except errors.Fatal:
                raise
            except Exception as exc:
                self._failed(name, state, exc)
            if self._closing.is_set():
                return
            try:
                async with asyncio.timeout(backoff_s(state.failures)):
                    await self._closing.wait()
                return  # closing: not restarted
            except TimeoutError:
                logger.info("loop %s: restarting", name, extra={"action": "loop_restart"})

    def _healthy(self, name: str, state: LoopState) -> None:
        state.failures = 0
        if state.degraded:
            state.degraded = False
            self._metrics.loop_degraded.labels(loop=name).set(0)
            logger.info("loop %s: running again", name, extra={"action": "loop_recovered"})

    def _failed(self, name: str, state: LoopState, exc: Exception) -> None:
        state.failures += 1
        state.degraded = True
        state.last_error = f"{type(exc).__name__}: {exc}"[:500]
        transient = isinstance(exc, errors.TRANSIENT)
        kind = "transient" if transient else "unexpected"
        self._metrics.loop_failures.labels(loop=name, kind=kind).inc()
        self._metrics.loop_degraded.labels(loop=name).set(1)
        delay = backoff_s(state.failures)
        if transient:
            logger.warning(
                "loop %s: %s; again in %.1fs", name, exc, delay, extra={"action": "loop_failed"}
            )
        else:
            logger.exception(
                "loop %s failed unexpectedly; restarting in %.1fs",
                name,
                delay,
                extra={"action": "loop_failed"},
            )
