"""Consumer: handlers by routing key; pulls at its own pace (prefetch, concurrency, rate limit),
acks after the handler returns, and moves failures to wait queues or the dead-letter queue.

Outcome of a delivery:
- the handler returns: ack;
- it raises (or exceeds ``timeout``): retried after the backoff, rounded up to a delay tier,
  until ``max_attempts``; then the dead-letter queue;
- it raises ``Retry(delay=)``: retried after that delay instead of the backoff;
- it raises ``Reject``, or the delivery breaks the contract: the dead-letter queue at once.

A failed delivery moves by publishing a copy (publisher confirms) to its wait queue or to .dead
and only then acking the original: RabbitMQ's per-queue dead-lettering can neither choose a delay
tier per message nor add the error headers. The wait queue's TTL dead-letters the copy back to the
work queue (at-least-once on quorum queues), and ``x-death`` records each retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue, FieldValue

from consumers_sdk import contract, retry, topology
from consumers_sdk import job as job_mod
from consumers_sdk.errors import Reject, Retry

logger = logging.getLogger(__name__)

RABBITMQ_CONSUMER_TIMEOUT_S = 1800.0  # RabbitMQ's default delivery acknowledgement timeout
ERROR_TEXT_LIMIT = 1000

Handler = Callable[[job_mod.Job], Awaitable[None] | None]


class Deduplicator(Protocol):
    """Optional: skip deliveries whose job id was already handled (at-least-once delivery)."""

    async def seen(self, job_id: str) -> bool: ...

    async def remember(self, job_id: str) -> None: ...


class MemoryDeduplicator:
    """The last ``capacity`` job ids this process handled; share a store across processes."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    async def seen(self, job_id: str) -> bool:
        return job_id in self._ids

    async def remember(self, job_id: str) -> None:
        self._ids[job_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    routing_key: str
    queue: str
    function: Handler
    max_attempts: int
    timeout_s: float
    backoff: retry.Backoff


class _RateLimit:
    def __init__(self, per_second: float | None) -> None:
        self._interval = 1.0 / per_second if per_second else 0.0
        self._next = 0.0

    async def acquire(self) -> None:
        if not self._interval:
            return
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + self._interval
        if start > now:
            await asyncio.sleep(start - now)


class Consumer:
    def __init__(
        self,
        amqp_url: str,
        *,
        group: str,
        prefetch: int = 32,
        concurrency: int | None = None,
        max_per_second: float | None = None,
        queue_type: topology.QueueType = "quorum",
        retry_tiers: Sequence[float] = retry.DEFAULT_TIERS,
        deduplicator: Deduplicator | None = None,
        stop_timeout_s: float = 30.0,
        exchange: str = contract.EXCHANGE,
        rng: random.Random | None = None,
    ) -> None:
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        self._url = amqp_url
        self.group = group
        self._prefetch = prefetch
        self._slots = asyncio.Semaphore(concurrency or prefetch)
        self._rate = _RateLimit(max_per_second)
        self._queue_type = queue_type
        self._tiers = retry.validate_tiers(retry_tiers)
        self._dedup = deduplicator
        self._stop_timeout_s = stop_timeout_s
        self._exchange = exchange
        self._rng = rng or random.Random()
        self._handlers: list[HandlerSpec] = []
        self._stop = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._publisher: AbstractChannel | None = None
        self.ready = asyncio.Event()
        self._running = 0
        self.max_in_flight = 0  # the most deliveries handled at once, for operators and tests

    def handler(
        self,
        routing_key: str,
        *,
        queue: str | None = None,
        max_attempts: int = 5,
        timeout: float = 30.0,
        backoff: retry.Backoff | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register a handler (async, or sync: run in a thread) for a routing key or pattern."""
        if timeout <= 0 or timeout >= RABBITMQ_CONSUMER_TIMEOUT_S:
            raise ValueError(
                f"timeout must be positive and below RabbitMQ's consumer timeout "
                f"({RABBITMQ_CONSUMER_TIMEOUT_S:.0f}s), or the broker closes the channel first"
            )
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

        def register(function: Handler) -> Handler:
            self._handlers.append(
                HandlerSpec(
                    routing_key=routing_key,
                    queue=queue or topology.work_queue(self.group, routing_key),
                    function=function,
                    max_attempts=max_attempts,
                    timeout_s=timeout,
                    backoff=backoff or retry.exponential(rng=self._rng),
                )
            )
            return function

        return register

    def stop(self) -> None:
        """Stop taking deliveries; ``run`` returns once the ones in flight are settled."""
        self._stop.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Consume until ``stop()`` or, with ``handle_signals``, SIGTERM/SIGINT."""
        if not self._handlers:
            raise ValueError("no handler registered")
        if handle_signals:
            self._install_signals()
        connection = await aio_pika.connect_robust(
            self._url, client_properties={"connection_name": f"consumer-{self.group}"}
        )
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self._prefetch)
            self._publisher = await connection.channel(publisher_confirms=True)
            consuming: list[tuple[AbstractQueue, str]] = []
            for spec in self._handlers:
                queue = await topology.declare(
                    channel,
                    work=spec.queue,
                    routing_key=spec.routing_key,
                    tiers=self._tiers,
                    queue_type=self._queue_type,
                    exchange=self._exchange,
                )
                consuming.append((queue, await queue.consume(partial(self._on_message, spec))))
            self.ready.set()
            await self._stop.wait()
            for queue, tag in consuming:
                with contextlib.suppress(Exception):  # the channel may be closing already
                    await queue.cancel(tag)
            if self._inflight:
                await asyncio.wait(self._inflight, timeout=self._stop_timeout_s)
        finally:
            await connection.close()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self.stop)

    async def _on_message(self, spec: HandlerSpec, message: AbstractIncomingMessage) -> None:
        task = asyncio.create_task(self._handle(spec, message), name=f"handle-{message.message_id}")
        self._inflight.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A bug in the SDK, not in a handler: the delivery stays unacked and comes back.
            logger.error("delivery handling crashed", exc_info=task.exception())

    async def _handle(self, spec: HandlerSpec, message: AbstractIncomingMessage) -> None:
        async with self._slots:
            await self._rate.acquire()
            self._running += 1
            self.max_in_flight = max(self.max_in_flight, self._running)
            try:
                await self._process(spec, message)
            finally:
                self._running -= 1

    async def _process(self, spec: HandlerSpec, message: AbstractIncomingMessage) -> None:
        try:
            job = job_mod.from_message(message, work_queue=spec.queue)
        except job_mod.Undecodable as exc:
            await self._move(spec, message, dead=True, attempt=1, error=exc)
            return
        if self._dedup is not None and await self._dedup.seen(job.id):
            await message.ack()
            return
        try:
            async with asyncio.timeout(spec.timeout_s):
                if inspect.iscoroutinefunction(spec.function):
                    await spec.function(job)
                else:
                    await asyncio.to_thread(spec.function, job)  # never block the loop
        except Reject as exc:
            await self._move(
                spec,
                message,
                dead=True,
                attempt=job.attempt,
                error=exc,
                routing_key=job.routing_key,
            )
        except Retry as exc:
            await self._fail(spec, job, exc, delay_s=exc.delay_s)
        except Exception as exc:  # any handler failure, a timeout included, is a failed attempt
            await self._fail(spec, job, exc, delay_s=None)
        else:
            await self._settle(message.ack)
            if self._dedup is not None:
                await self._dedup.remember(job.id)

    async def _fail(
        self, spec: HandlerSpec, job: job_mod.Job, error: BaseException, *, delay_s: float | None
    ) -> None:
        if job.attempt >= spec.max_attempts:
            await self._move(
                spec,
                job.message,
                dead=True,
                attempt=job.attempt,
                error=error,
                routing_key=job.routing_key,
            )
            return
        delay = spec.backoff(job.attempt) if delay_s is None else delay_s
        await self._move(
            spec,
            job.message,
            dead=False,
            attempt=job.attempt,
            error=error,
            tier_s=retry.tier_for(delay, self._tiers),
            routing_key=job.routing_key,
        )

    async def _move(
        self,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        *,
        dead: bool,
        attempt: int,
        error: BaseException,
        tier_s: float = 0.0,
        routing_key: str | None = None,
    ) -> None:
        """Publish a confirmed copy to a wait queue or .dead, then ack the original."""
        text = f"{type(error).__name__}: {error}"[:ERROR_TEXT_LIMIT]
        headers: dict[str, FieldValue] = dict(message.headers or {})
        if dead:
            target = topology.dead_queue(spec.queue)
            headers.update(
                {
                    "x-dead-error": text,
                    "x-dead-attempts": attempt,
                    "x-dead-at": contract.format_run_at(datetime.now(UTC)),
                    "x-dead-queue": spec.queue,
                    "x-dead-routing-key": routing_key or message.routing_key or "",
                }
            )
            logger.warning("job %s dead after %d attempts: %s", message.message_id, attempt, text)
        else:
            target = topology.wait_queue(spec.queue, tier_s)
            headers[job_mod.HEADER_ATTEMPT] = attempt + 1
            headers[job_mod.HEADER_LAST_ERROR] = text
            headers[job_mod.HEADER_ROUTING_KEY] = routing_key or message.routing_key or ""
        copy = aio_pika.Message(
            body=message.body,
            headers=headers,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            priority=message.priority,
            correlation_id=message.correlation_id,
            message_id=message.message_id,
            timestamp=message.timestamp,
            type=message.type,
            app_id=message.app_id,
        )
        assert self._publisher is not None
        try:
            await self._publisher.default_exchange.publish(copy, routing_key=target)
        except Exception as exc:  # not confirmed: keep the original, it comes back to us
            logger.warning("could not move job %s to %s: %r", message.message_id, target, exc)
            await self._settle(partial(message.nack, requeue=True))
            return
        await self._settle(message.ack)

    async def _settle(self, action: Callable[[], Awaitable[Any]]) -> None:
        # After a reconnection the delivery tag belongs to a dead channel: the broker has already
        # requeued that delivery, so there is nothing left to settle (and nothing acked twice).
        try:
            await action()
        except Exception as exc:
            logger.info("delivery not settled (channel gone, it will be redelivered): %r", exc)
