"""Prometheus metrics of a consumer, optional: the ``metrics`` extra
(``pip install 'delay-dispatcher-sdk[metrics]'``) brings prometheus-client, imported only when a
``ConsumerMetrics`` is built.

Every series is labelled by consumer ``group`` and by the handler's ``routing_key`` (the key or
pattern it was registered with, so a topic pattern stays one series):

- ``dispatcher_consumer_handled_total``: handlers that returned (the delivery was acked);
- ``dispatcher_consumer_failed_total``: attempts that raised or ran past their timeout
  (``Reject`` and ``Retry`` included);
- ``dispatcher_consumer_retried_total{tier}``: failed attempts sent to the wait queue of that
  delay tier (seconds);
- ``dispatcher_consumer_dead_total``: deliveries parked in ``.dead`` (undecodable ones too);
- ``dispatcher_consumer_handler_duration_seconds``: each handler run, whatever its outcome;
- ``dispatcher_consumer_events_dropped_total`` (by ``group`` only): job events dropped because
  the reporter's buffer was full.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, cast
from wsgiref.simple_server import WSGIServer

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

    from consumers_sdk.reporter import EventReporter

PREFIX: Final = "dispatcher_consumer"
LABELS: Final = ("group", "routing_key")


class ConsumerMetrics:
    """The consumer's collectors, registered once in ``registry`` (a new one when None: read it
    at ``.registry``). One instance may serve several consumers of the application."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        try:
            import prometheus_client as prom
        except ImportError as exc:
            raise ImportError(
                "consumer metrics need prometheus-client: "
                "pip install 'delay-dispatcher-sdk[metrics]'"
            ) from exc

        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.handled = prom.Counter(
            f"{PREFIX}_handled", "Handlers that returned", LABELS, registry=self.registry
        )
        self.failed = prom.Counter(
            f"{PREFIX}_failed", "Handler attempts that failed", LABELS, registry=self.registry
        )
        self.retried = prom.Counter(
            f"{PREFIX}_retried",
            "Failed attempts sent to a wait queue, by delay tier (seconds)",
            (*LABELS, "tier"),
            registry=self.registry,
        )
        self.dead = prom.Counter(
            f"{PREFIX}_dead",
            "Deliveries parked in the dead-letter queue",
            LABELS,
            registry=self.registry,
        )
        self.duration = prom.Histogram(
            f"{PREFIX}_handler_duration_seconds",
            "Handler run time, whatever the outcome",
            LABELS,
            registry=self.registry,
        )
        self._reporters: list[EventReporter] = []
        self.registry.register(cast("Collector", _DroppedEvents(self._reporters)))

    def watch(self, reporter: EventReporter) -> None:
        """Count the events ``reporter`` drops (a consumer calls it with its own reporter)."""
        if reporter not in self._reporters:
            self._reporters.append(reporter)

    def outcome(self, group: str, routing_key: str, outcome: str, duration_s: float) -> None:
        """One handler run: ``handled`` or ``failed``."""
        self.duration.labels(group, routing_key).observe(duration_s)
        (self.handled if outcome == "handled" else self.failed).labels(group, routing_key).inc()

    def moved(self, group: str, routing_key: str, *, tier_s: float | None) -> None:
        """A failed delivery moved on: to the wait queue of ``tier_s``, or to .dead (None)."""
        if tier_s is None:
            self.dead.labels(group, routing_key).inc()
        else:
            self.retried.labels(group, routing_key, f"{tier_s:g}").inc()


class _DroppedEvents:
    """Reads the reporters' own drop counts at scrape time (the reporter knows no Prometheus)."""

    def __init__(self, reporters: list[EventReporter]) -> None:
        self._reporters = reporters

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            f"{PREFIX}_events_dropped",
            "Job events dropped because the reporter's buffer was full",
            labels=["group"],
        )
        totals: dict[str, int] = {}
        for reporter in self._reporters:
            totals[reporter.group] = totals.get(reporter.group, 0) + reporter.dropped
        for group, dropped in totals.items():
            family.add_metric([group], dropped)
        yield family


class MetricsServer:
    """``registry`` served on ``host:port`` (``/metrics``) from a thread, while a consumer runs."""

    def __init__(self, registry: CollectorRegistry, *, port: int, host: str = "127.0.0.1") -> None:
        self._registry = registry
        self.port = port
        self._host = host
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._server is not None:
            return
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(
            self.port, addr=self._host, registry=self._registry
        )
        self.port = self._server.server_port  # the one chosen, when 0 asked for any

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        # shutdown() waits for the serving loop's next poll: not on the event loop.
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
