"""Supervision: every background loop of a node runs under ``Supervisor.supervise``.

A loop whose body returns has ended (a drained firer, a publisher that connected). A body that
raises is run again after a backoff, whatever it raised, and shows as degraded in ``/readyz``
until its new run has lasted ``HEALTHY_AFTER_S``:

    running --raises--> degraded (backoff: 0.5 s doubling to 30 s) --runs again--> running
    running/degraded --lasted HEALTHY_AFTER_S--> healthy (the backoff starts over)

A loop that holds what a restart would lose (a batch of marks to write, events not acked yet)
retries inside instead, and says so: ``report_degraded(part, error)`` shows it degraded in
``/readyz`` until ``report_recovered(part)``, without a restart.

Failures the services cause (``errors.TRANSIENT``: PostgreSQL, RabbitMQ or ZooKeeper not there)
are logged in a line; anything else is a bug or a poison input and is logged with its traceback.
Both are counted by loop and kind. Only ``errors.Fatal`` (what cannot heal: a shard-count
mismatch, a schema newer than the code) leaves the loop, and with it the node.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dispatcher import errors, metrics
from dispatcher.timing.kinds import Mono

logger = logging.getLogger(__name__)

HEALTHY_AFTER_S = 5.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
CANCEL_AGAIN_S = 1.0
# Past this many doublings every pause is the cap (and 2**n stays a float).
_MAX_DOUBLINGS = 64


@dataclass(slots=True)
class Backoff:
    """Pauses after failures in a row: ``first_s`` after the first, doubling up to ``max_s``.
    ``next`` counts a failure and gives the pause after it; ``reset`` after a success. Every
    retrying loop of the dispatcher paces itself with one; pure."""

    first_s: float
    max_s: float
    failures: int = 0  # in a row, since the last reset

    def next(self) -> float:
        self.failures += 1
        return self.pause_s()

    def pause_s(self) -> float:
        """The pause after the failures counted so far (``first_s`` before any)."""
        doublings = min(max(self.failures - 1, 0), _MAX_DOUBLINGS)
        return float(min(self.first_s * 2.0**doublings, self.max_s))

    def reset(self) -> None:
        self.failures = 0


def restarts() -> Backoff:
    """The pace of a loop's restarts unless its task row sets its own."""
    return Backoff(first_s=FIRST_BACKOFF_S, max_s=MAX_BACKOFF_S)


@dataclass(slots=True)
class LoopState:
    """What ``/readyz`` shows of one loop."""

    backoff: Backoff = field(default_factory=restarts)  # its restarts since it last ran well
    degraded: bool = False  # failed, and its new run has not lasted HEALTHY_AFTER_S yet
    last_error: str | None = None
    reported: dict[str, str] = field(default_factory=dict)  # part -> why, said by the loop

    @property
    def failures(self) -> int:
        """In a row, since it last ran ``HEALTHY_AFTER_S``."""
        return self.backoff.failures


# Where a running loop's reports go: set by ``supervise`` for each run of a body, and so
# inherited by every task that body starts (the firer's marks task reports as "firing").
_Report = Callable[[str, str | None], None]
_report_to: contextvars.ContextVar[_Report | None] = contextvars.ContextVar(
    "supervised_loop", default=None
)


def report_degraded(part: str, error: BaseException) -> None:
    """The loop this runs in is degraded: its ``part`` keeps failing with ``error`` and retries
    inside (it holds what a restart would lose). Shown in ``/readyz`` until ``report_recovered``.
    Outside a supervised loop (a component driven alone, the node starting) it does nothing."""
    report = _report_to.get()
    if report is not None:
        report(part, f"{type(error).__name__}: {error}"[:500])


def report_recovered(part: str) -> None:
    """``part`` of the loop this runs in works again (after ``report_degraded``)."""
    report = _report_to.get()
    if report is not None:
        report(part, None)


async def _stopped(run: asyncio.Future[None]) -> None:
    """Cancel ``run`` and wait for it to end, cancelling again every ``CANCEL_AGAIN_S``: a body
    can swallow one cancellation (aiormq closes the channel of a cancelled call and carries on),
    and a node must still stop."""
    while not run.done():
        run.cancel()
        await asyncio.wait({run}, timeout=CANCEL_AGAIN_S)


class Supervisor:
    def __init__(self, metrics: metrics.Metrics, *, mono: Mono = time.monotonic) -> None:
        self._metrics = metrics
        self._mono = mono
        self._closing = asyncio.Event()
        self.loops: dict[str, LoopState] = {}

    def close(self) -> None:
        """No loop is restarted from now on: the node is stopping."""
        self._closing.set()

    def degraded(self) -> dict[str, str]:
        """The loops failing now, with their last error (or what their parts reported)."""
        shown: dict[str, str] = {}
        for name, state in self.loops.items():
            if state.degraded:
                shown[name] = state.last_error or "failing"
            elif state.reported:
                shown[name] = "; ".join(f"{part}: {why}" for part, why in state.reported.items())
        return shown

    async def supervise(
        self, name: str, body: Callable[[], Awaitable[None]], backoff: Backoff | None = None
    ) -> None:
        """Run ``body`` until it returns, restarting it after every failure but a fatal one,
        paced by ``backoff`` (``restarts()`` when None)."""
        state = self.loops.setdefault(name, LoopState())
        if backoff is not None:
            state.backoff = dataclasses.replace(backoff, failures=0)
        self._metrics.loop_degraded.labels(loop=name).set(0)
        while True:
            token = _report_to.set(functools.partial(self._reported, name, state))
            try:
                run = asyncio.ensure_future(body())  # its task, and those it starts, report here
            finally:
                _report_to.reset(token)
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
            finally:
                state.reported.clear()  # said by the run that ended
                self._show(name, state)
            if self._closing.is_set():
                return
            try:
                async with asyncio.timeout(state.backoff.pause_s()):
                    await self._closing.wait()
                return  # closing: not restarted
            except TimeoutError:
                logger.info("loop %s: restarting", name, extra={"action": "loop_restart"})

    def _reported(self, name: str, state: LoopState, part: str, why: str | None) -> None:
        if why is not None:
            state.reported[part] = why
        elif state.reported.pop(part, None) is not None:
            logger.info("loop %s: %s working again", name, part, extra={"action": "loop_recovered"})
        self._show(name, state)

    def _show(self, name: str, state: LoopState) -> None:
        failing = state.degraded or bool(state.reported)
        self._metrics.loop_degraded.labels(loop=name).set(1 if failing else 0)

    def _healthy(self, name: str, state: LoopState) -> None:
        state.backoff.reset()
        if state.degraded:
            state.degraded = False
            self._show(name, state)
            logger.info("loop %s: running again", name, extra={"action": "loop_recovered"})

    def _failed(self, name: str, state: LoopState, exc: Exception) -> None:
        delay = state.backoff.next()
        state.degraded = True
        state.last_error = f"{type(exc).__name__}: {exc}"[:500]
        transient = isinstance(exc, errors.TRANSIENT)
        kind = "transient" if transient else "unexpected"
        self._metrics.loop_failures.labels(loop=name, kind=kind).inc()
        self._show(name, state)
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


class Rounds:
    """The shape every polling loop of a node shares: a round of work, then a rest of ``poll_s``
    (cut short by ``wake`` or ``stop``), until ``stop``. A round that fails because PostgreSQL
    is away (``errors.StoreUnavailable``: what it did was rolled back) is shown degraded in
    ``/readyz`` under PART, handed to ON_PAUSED to log, and tried again after the rest; the next
    round that works clears it. A round that returns True is busy: the next starts at once.
    Anything else a round raises leaves ``run``, for the supervisor to restart the loop."""

    def __init__(
        self,
        part: str,
        poll_s: float,
        *,
        on_paused: Callable[[errors.StoreUnavailable], None],
    ) -> None:
        self.part = part
        self._poll_s = poll_s
        self._on_paused = on_paused
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    def wake(self) -> None:
        """Start the next round now rather than after the rest."""
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self, work: Callable[[], Awaitable[bool | None]]) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            busy = False
            try:
                busy = bool(await work())
                report_recovered(self.part)
            except errors.StoreUnavailable as exc:
                report_degraded(self.part, exc)
                self._on_paused(exc)
            if not busy:
                await self._until(self._poll_s, self._stop, self._wake)

    async def pause(self, seconds: float) -> None:
        """Rest within a round: SECONDS, or until ``stop``."""
        await self._until(seconds, self._stop)

    @staticmethod
    async def _until(seconds: float, *events: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
