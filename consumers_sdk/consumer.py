"""Consumer: handlers by routing key, pulling at their own pace (prefetch, concurrency, rate
limit); what happens to each delivery is ``delivery.py``'s business.

Lifecycle: ``run`` connects (retrying until the broker answers; aio-pika heals later losses),
declares the topology, consumes until ``stop()`` or SIGTERM/SIGINT, then stops taking deliveries,
hands back those not yet started, lets the running ones finish and settle for up to
``stop_timeout_s``, cancels the rest (unacked, so RabbitMQ redelivers them) and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from consumers_sdk import (
    acks,
    contract,
    dedup,
    delivery,
    failover,
    outcome,
    reporter,
    retry,
    topology,
)
from consumers_sdk import metrics as metrics_mod

logger = logging.getLogger(__name__)

RABBITMQ_CONSUMER_TIMEOUT_S = 1800.0  # RabbitMQ's default delivery acknowledgement timeout
RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 5.0


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
    """Jobs of one consumer group: ``@consumer.handler(routing_key, ...)`` registers, ``run()``
    consumes.

    ``amqp_url`` is one broker URL, or a cluster's nodes as a comma-separated string or a list
    (``broker_urls``): the consumer connects to the first that answers and moves to the next when
    its node goes away.

    ``prefetch`` bounds the unacked deliveries the broker sends ahead, ``concurrency`` (default:
    ``prefetch``) the handlers running at once, ``max_per_second`` their start rate.
    ``retry_tiers`` are the wait queues' delays in seconds (a backoff is rounded up to one);
    ``queue_type`` is ``"quorum"`` (replicated, at-least-once dead-lettering) or ``"classic"``.
    """

    def __init__(
        self,
        amqp_url: failover.Urls,
        *,
        group: str,
        prefetch: int = 32,
        concurrency: int | None = None,
        max_per_second: float | None = None,
        queue_type: topology.QueueType = "quorum",
        retry_tiers: Sequence[float] = retry.DEFAULT_TIERS,
        deduplicator: dedup.Deduplicator | None = None,
        stop_timeout_s: float = 30.0,
        consumer_timeout_s: float = RABBITMQ_CONSUMER_TIMEOUT_S,
        exchange: str = contract.EXCHANGE,
        rng: random.Random | None = None,
        report_events: bool = True,
        events_buffer: int = 10_000,
        name: str | None = None,
        metrics: metrics_mod.ConsumerMetrics | None = None,
    ) -> None:
        """``consumer_timeout_s`` is the broker's ``consumer_timeout`` (rabbitmq.conf): a delivery
        not settled by then closes the channel, so handler timeouts must stay below it.

        ``report_events`` sends each attempt's outcome to the dispatcher (``reporter.py``), at
        most ``events_buffer`` of them held while the broker refuses; ``name`` is this consumer
        in those events (default: host-pid). ``metrics`` counts each outcome in Prometheus
        collectors (``consumers_sdk.metrics``) in a registry the application owns; or call
        ``serve_metrics(port)``."""
        self._started = False
        self._pace(prefetch, concurrency, max_per_second)
        self._url = amqp_url
        self.group = group
        self._queue_type = queue_type
        self._tiers = retry.validate_tiers(retry_tiers)
        self._dedup = deduplicator
        self._outcomes: delivery.Outcomes | None = None
        self._stop_timeout_s = stop_timeout_s
        self._consumer_timeout_s = consumer_timeout_s
        self._exchange = exchange
        self._rng = rng or random.Random()
        self.events = (
            reporter.EventReporter(
                amqp_url,
                group=group,
                consumer=name or reporter.default_consumer_name(),
                capacity=events_buffer,
            )
            if report_events
            else None
        )
        self.metrics = metrics
        self._metrics_server: metrics_mod.MetricsServer | None = None
        if metrics is not None and self.events is not None:
            metrics.watch(self.events)
        self._handlers: list[outcome.HandlerSpec] = []
        self._stop = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._acks = acks.Acks()
        self.ready = asyncio.Event()
        self._running = 0
        self.max_in_flight = 0  # the most deliveries handled at once, for operators and tests

    def _pace(self, prefetch: int, concurrency: int | None, max_per_second: float | None) -> None:
        if prefetch < 1 or (concurrency is not None and concurrency < 1):
            raise ValueError("prefetch and concurrency must be at least 1")
        if max_per_second is not None and max_per_second <= 0:
            raise ValueError("max_per_second must be positive")
        self._prefetch = prefetch
        self._concurrency_given = concurrency
        self._concurrency = min(concurrency or prefetch, prefetch)
        self._slots = asyncio.Semaphore(self._concurrency)
        self._rate = _RateLimit(max_per_second)
        self._max_per_second = max_per_second

    def configure(
        self,
        *,
        prefetch: int | None = None,
        concurrency: int | None = None,
        max_per_second: float | None = None,
    ) -> None:
        """Override the pace given to the constructor (what ``dispatcher-consumer``'s flags do);
        ``None`` keeps a setting. Only before ``run``: a running consumer's channel and slots
        are sized already."""
        if self._started:
            raise RuntimeError("configure() before run(), not while the consumer runs")
        self._pace(
            self._prefetch if prefetch is None else prefetch,
            self._concurrency_given if concurrency is None else concurrency,
            self._max_per_second if max_per_second is None else max_per_second,
        )

    @property
    def prefetch(self) -> int:
        return self._prefetch

    @property
    def concurrency(self) -> int:
        """Handlers running at once: ``concurrency``, else ``prefetch``; at most ``prefetch``."""
        return self._concurrency

    @property
    def max_per_second(self) -> float | None:
        return self._max_per_second

    @property
    def handlers(self) -> tuple[outcome.HandlerSpec, ...]:
        """The registered handlers in registration order (``consumers_sdk.testing`` runs them)."""
        return tuple(self._handlers)

    @property
    def retry_tiers(self) -> tuple[float, ...]:
        """The wait queues' delays in seconds, sorted: a retry's delay is rounded up to one."""
        return self._tiers

    def handler(
        self,
        routing_key: str,
        *,
        queue: str | None = None,
        max_attempts: int = 5,
        timeout: float = 30.0,
        backoff: retry.Backoff | None = None,
    ) -> Callable[[outcome.Handler], outcome.Handler]:
        """Register a handler for a routing key or topic pattern: async, or sync (run in a thread;
        a sync handler past its timeout counts as failed but its thread runs on to the end)."""
        if timeout <= 0 or timeout >= self._consumer_timeout_s:
            raise ValueError(
                f"timeout must be positive and below RabbitMQ's consumer timeout "
                f"({self._consumer_timeout_s:.0f}s), or the broker closes the channel first"
            )
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

        def register(function: outcome.Handler) -> outcome.Handler:
            self._handlers.append(
                outcome.HandlerSpec(
                    routing_key=routing_key,
                    queue=queue or topology.work_queue(self.group, routing_key),
                    function=function,
                    max_attempts=max_attempts,
                    timeout_s=timeout,
                    backoff=backoff or retry.polynomial(rng=self._rng),
                )
            )
            return function

        return register

    def serve_metrics(self, port: int, *, host: str = "127.0.0.1") -> None:
        """Serve the metrics on ``http://host:port/metrics`` while ``run`` runs (port 0: any
        free one, then read at ``metrics_port``); builds the metrics if none were given.

        On this machine only by default: the page has no authentication. ``host="0.0.0.0"``
        (or one interface's address) lets a Prometheus on another host scrape it."""
        if self.metrics is None:
            self.metrics = metrics_mod.ConsumerMetrics()
            if self.events is not None:
                self.metrics.watch(self.events)
        self._metrics_server = metrics_mod.MetricsServer(
            self.metrics.registry, port=port, host=host
        )

    @property
    def metrics_port(self) -> int | None:
        return None if self._metrics_server is None else self._metrics_server.port

    def stop(self) -> None:
        """Stop taking deliveries; ``run`` returns once the ones in flight are settled."""
        self._stop.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Consume until ``stop()`` or, with ``handle_signals``, SIGTERM/SIGINT."""
        if not self._handlers:
            raise ValueError("no handler registered")
        self._warn_if_deliveries_can_outwait_the_broker()
        signals = install_stop_signals(self.stop) if handle_signals else []
        self._started = True
        try:
            if self._metrics_server is not None:
                self._metrics_server.start()
            connection = await self._connect()
            if connection is None:  # stopped before the broker answered
                return
            try:
                await self._consume(connection)
            finally:
                if self.events is not None:  # flushed on its own connection, after the drain
                    await self.events.close(timeout_s=min(self._stop_timeout_s, 5.0))
                await connection.close()
                self._outcomes = None
        finally:
            self._started = False
            if self._metrics_server is not None:
                await self._metrics_server.close()
            remove_stop_signals(signals)

    async def _connect(self) -> AbstractRobustConnection | None:
        """The first connection, retried until the broker answers; later losses aio-pika heals."""
        backoff = retry.Doubling(first_s=RECONNECT_FIRST_S, max_s=RECONNECT_MAX_S)
        while not self._stop.is_set():
            try:
                return await failover.connect_robust(
                    self._url, connection_name=f"consumer-{self.group}"
                )
            except aiormq.exceptions.ProbableAuthenticationError:
                raise
            except (OSError, TimeoutError, aiormq.exceptions.AMQPConnectionError) as exc:
                delay = backoff.next()
                logger.warning("RabbitMQ not reachable (%r); retrying in %.1fs", exc, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
        return None

    async def _consume(self, connection: AbstractRobustConnection) -> None:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=self._prefetch)

        # Mandatory publishes that raise when unroutable: a copy that reached no queue must not
        # count as moved (the original would be acked and the job lost).
        async def open_publisher() -> AbstractChannel:
            return await connection.channel(publisher_confirms=True, on_return_raises=True)

        self._outcomes = delivery.Outcomes(
            await open_publisher(),
            open_publisher=open_publisher,
            acks=self._acks,
            tiers=self._tiers,
            deduplicator=self._dedup,
            events=self.events,
            metrics=self.metrics,
            group=self.group,
        )
        if self.events is not None:
            self.events.open()
        standing = await topology.declare(
            self._url, self._topology, connection_name=f"consumer-{self.group}-declare"
        )
        consuming = []
        for spec in self._handlers:
            # Redeclared as it stands on the robust channel, which restores it after a reconnect.
            queue = await channel.declare_queue(
                spec.queue, durable=True, arguments=standing[spec.queue]
            )
            consuming.append((queue, await queue.consume(partial(self._on_message, spec))))
        self.ready.set()
        await self._stop.wait()
        for queue, tag in consuming:
            with contextlib.suppress(Exception):  # the channel may be closing already
                await queue.cancel(tag)
        await self._drain()

    def _topology(self, major: int) -> list[topology.QueueSpec]:
        return [
            queue
            for spec in self._handlers
            for queue in topology.handler_queues(
                work=spec.queue,
                routing_key=spec.routing_key,
                tiers=self._tiers,
                queue_type=self._queue_type,
                major=major,
                exchange=self._exchange,
            )
        ]

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._stop_timeout_s
        while self._inflight:
            remaining = deadline - loop.time()
            if remaining <= 0:
                late = set(self._inflight)
                logger.warning("%d jobs still running at the stop deadline: unacked", len(late))
                for task in late:
                    task.cancel()
                await asyncio.wait(late)
                continue
            await asyncio.wait(set(self._inflight), timeout=remaining)
        await self._acks.drained()  # queued before the channel closes

    def _warn_if_deliveries_can_outwait_the_broker(self) -> None:
        # A delivery waits in the prefetch buffer behind up to prefetch/concurrency handlers
        # before its own starts; the broker's consumer timeout counts all of that.
        worst_s = math.ceil(self._prefetch / self._concurrency) * max(
            spec.timeout_s for spec in self._handlers
        )
        if self._max_per_second:
            worst_s = max(worst_s, self._prefetch / self._max_per_second)
        if worst_s >= self._consumer_timeout_s:
            logger.warning(
                "a delivery may wait %.0fs before it is settled (prefetch %d, concurrency %d): "
                "past RabbitMQ's consumer timeout of %.0fs; lower prefetch or timeouts",
                worst_s,
                self._prefetch,
                self._concurrency,
                self._consumer_timeout_s,
            )

    async def _on_message(
        self, spec: outcome.HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        # aio-pika runs this callback as a task of its own, one per delivery, in delivery order:
        # the delivery is handled in it (a task of ours on top cost ~5% of the consumer's CPU).
        self._acks.delivered(message)
        task = asyncio.current_task()
        assert task is not None  # aio-pika calls a coroutine callback in a task
        self._inflight.add(task)
        try:
            await self._handle(spec, message)
        except Exception:
            # A bug in the SDK, not in a handler: the delivery stays unacked and comes back.
            logger.exception("delivery handling crashed")
        finally:
            self._inflight.discard(task)

    async def _handle(self, spec: outcome.HandlerSpec, message: AbstractIncomingMessage) -> None:
        async with self._slots:
            if not self._stop.is_set():
                await self._rate.acquire()
            if self._stop.is_set():  # stopping: hand it back now rather than start it
                await self._acks.nack(message)
                return
            self._running += 1
            self.max_in_flight = max(self.max_in_flight, self._running)
            try:
                assert self._outcomes is not None
                await self._outcomes.process(spec, message)
            finally:
                self._running -= 1


def install_stop_signals(stop: Callable[[], None]) -> list[signal.Signals]:
    """The one way signals are handled: SIGTERM and SIGINT call ``stop`` on the running loop.
    Returns the signals installed (none off the main thread), for ``remove_stop_signals``."""
    if threading.current_thread() is not threading.main_thread():
        return []
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop)
            installed.append(signum)
    return installed


def remove_stop_signals(signals: Sequence[signal.Signals]) -> None:
    loop = asyncio.get_running_loop()
    for signum in signals:
        loop.remove_signal_handler(signum)
