"""A Consumer run by a web application's lifespan: FastAPI's, or any ASGI framework's that takes
Starlette's ``lifespan(app)`` (this module imports no framework).

``FastAPI(lifespan=consumer_lifespan(consumer))``, or ``async with consumer_lifespan(consumer):``
inside a lifespan of your own. Starting runs ``consumer.run(handle_signals=False)`` as a task (the
server owns the signals) and waits until it consumes; ending, which the server does on SIGTERM
after its last request, stops it: no new deliveries, the running handlers finish and are acked
(up to the Consumer's ``stop_timeout_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from consumers_sdk.consumer import Consumer

logger = logging.getLogger(__name__)


def consumer_lifespan(consumer: Consumer, *, ready_timeout_s: float | None = 60.0) -> Lifespan:
    """Run ``consumer`` while the application lives.

    Startup waits up to ``ready_timeout_s`` for the consumer to consume (RabbitMQ reached, queues
    declared) and fails the application's startup otherwise, or at once with the consumer's own
    error (bad credentials, no handler); ``None`` starts it without waiting, the consumer then
    connecting (and retrying) in the background. A Consumer runs once: one lifespan each.
    """
    return Lifespan(consumer, ready_timeout_s=ready_timeout_s)


class Lifespan(contextlib.AbstractAsyncContextManager[None]):
    """An async context manager that runs a Consumer, and is its own lifespan factory: an ASGI
    framework calls it with the application and gets it back."""

    def __init__(self, consumer: Consumer, *, ready_timeout_s: float | None) -> None:
        self.consumer = consumer
        self._ready_timeout_s = ready_timeout_s
        self._task: asyncio.Task[None] | None = None
        self._serving = False  # started: an error ending the consumer now is logged

    def __call__(self, app: object) -> Lifespan:
        return self

    async def __aenter__(self) -> None:
        if self._task is not None:
            raise RuntimeError("this consumer is running already")
        self._task = asyncio.create_task(
            self.consumer.run(handle_signals=False), name=f"consumer-{self.consumer.group}"
        )
        self._task.add_done_callback(self._ended)
        if self._ready_timeout_s is not None:
            try:
                await self._consuming(self._task, self._ready_timeout_s)
            except BaseException:  # the startup fails (or is cancelled): no consumer left behind
                await self._stop()
                raise
        self._serving = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stop()

    async def _consuming(self, task: asyncio.Task[None], timeout_s: float) -> None:
        ready = asyncio.create_task(self.consumer.ready.wait(), name="consumer-ready")
        try:
            await asyncio.wait(
                {task, ready}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ready.cancel()
            await asyncio.wait({ready})
        if task.done():  # ended before it consumed: its error is the startup's
            task.result()
            raise RuntimeError("the consumer stopped before it consumed")
        if not self.consumer.ready.is_set():
            raise TimeoutError(f"the consumer was not consuming after {timeout_s:g}s")

    async def _stop(self) -> None:
        task, self._task, self._serving = self._task, None, False
        if task is None or task.done():  # never started, or ended already (and said why)
            return
        self.consumer.stop()
        await task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self._serving and not task.cancelled() and task.exception() is not None:
            # The application runs on without its consumer: said loudly, once.
            logger.error(
                "consumer %s stopped on an error", self.consumer.group, exc_info=task.exception()
            )
