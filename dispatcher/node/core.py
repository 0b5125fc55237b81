"""What every subsystem of a node shares: its settings, metrics and supervisor, the database pool,
the job table, the node's time, and the one LISTEN connection every notice arrives on."""

from __future__ import annotations

from dataclasses import dataclass

from consumers_sdk import broker_urls
from dispatcher import metrics, supervision
from dispatcher.lifecycle import Task
from dispatcher.settings import Settings
from dispatcher.store import listen
from dispatcher.store.clock import ClockStore
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore
from dispatcher.store.listen import ChannelListener
from dispatcher.timing.kinds import Mono
from dispatcher.timing.timekeeper import Timekeeper


@dataclass(frozen=True, slots=True)
class Core:
    settings: Settings
    metrics: metrics.Metrics
    supervisor: supervision.Supervisor
    db: Database
    jobs: JobStore
    # The node's time is PostgreSQL's clock, measured: never this host's wall clock.
    timekeeper: Timekeeper
    # One LISTEN connection for every notice: due jobs, key changes, flow rule changes.
    notices: ChannelListener
    # The broker URLs with the node's heartbeat (``amqp_urls``), for every AMQP connection.
    amqp_urls: tuple[str, ...]

    def tasks(self) -> list[Task]:
        relisten = supervision.Backoff(
            first_s=listen.RECONNECT_FIRST_S, max_s=listen.RECONNECT_MAX_S
        )
        return [
            Task("clock", self.timekeeper.run),
            Task("notices", self.notices.run, backoff=relisten),
        ]


def build_core(settings: Settings, *, mono: Mono) -> Core:
    node_metrics = metrics.Metrics(routing_key_labels=settings.metrics_routing_keys)
    db = Database(
        settings.database_url,
        min_size=settings.db_pool_min,
        max_size=settings.db_pool_max,
        timeout_s=settings.db_timeout_s,
        dead_connection_s=settings.dead_connection_s,
    )
    return Core(
        settings=settings,
        metrics=node_metrics,
        supervisor=supervision.Supervisor(node_metrics),
        db=db,
        jobs=JobStore(db, node_id=settings.node_id, lease_s=settings.lease_s),
        timekeeper=Timekeeper(
            ClockStore(db),
            node_metrics,
            max_offset_s=settings.clock_max_offset_s,
            interval_s=settings.clock_sample_s,
            mono=mono,
        ),
        notices=ChannelListener(db, name=f"dispatcher-{settings.node_id}-notices"),
        amqp_urls=amqp_urls(settings),
    )


def amqp_urls(settings: Settings) -> tuple[str, ...]:
    """The broker URLs with a heartbeat of half ``dead_connection_s`` where a URL sets none: the
    broker drops a connection it has not heard from in two of them (a node whose packets stopped
    arriving), rather than after RabbitMQ's default of a minute."""
    heartbeat = max(1, round(settings.dead_connection_s / 2))
    return broker_urls.with_default(settings.amqp_url, "heartbeat", str(heartbeat))
