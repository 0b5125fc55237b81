"""The node's AMQP connections: two publishers (the firing one, and one for jobs due at once) and
the consumer of the outcome events the consumers report, which records them as history."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher import supervision
from dispatcher.amqp import events as events_mod
from dispatcher.amqp import publisher as publisher_mod
from dispatcher.amqp.events import EventsConsumer
from dispatcher.amqp.publisher import Publisher
from dispatcher.lifecycle import Task
from dispatcher.node.core import Core
from dispatcher.store.history import HistoryStore


@dataclass(frozen=True, slots=True)
class Messaging:
    publisher: Publisher  # what firing publishes through
    live_publisher: Publisher  # jobs due at once, beside a backlog the first one drains
    history: HistoryStore
    events: EventsConsumer

    def tasks(self) -> list[Task]:
        # Loops whose service errors reach the supervisor restart at the pace they retried at.
        reconnect = supervision.Backoff(
            first_s=publisher_mod.RECONNECT_FIRST_S, max_s=publisher_mod.RECONNECT_MAX_S
        )
        retry = supervision.Backoff(first_s=events_mod.RETRY_FIRST_S, max_s=events_mod.RETRY_MAX_S)
        return [
            Task("amqp-connect", self.publisher.run, backoff=reconnect),
            Task("amqp-connect-live", self.live_publisher.run, backoff=reconnect),
            Task("events", self.events.run, backoff=retry),
        ]


def build_messaging(core: Core) -> Messaging:
    settings = core.settings
    history = HistoryStore(core.db, settings.event_grants())
    return Messaging(
        publisher=_publisher(core, "publisher"),
        live_publisher=_publisher(core, "live-publisher"),
        history=history,
        events=EventsConsumer(
            core.amqp_urls,
            store=history,
            metrics=core.metrics,
            connection_name=f"dispatcher-{settings.node_id}-events",
            batch=settings.events_batch,
            prefetch=settings.events_prefetch,
            max_message_bytes=settings.events_max_message_bytes,
            stats_interval_s=settings.stats_interval_s,
            dead_connection_s=settings.dead_connection_s,
        ),
    )


def _publisher(core: Core, role: str) -> Publisher:
    settings = core.settings
    return Publisher(
        core.amqp_urls,
        exchange=settings.exchange,
        unroutable_exchange=settings.unroutable_exchange,
        connection_name=f"dispatcher-{settings.node_id}-{role}",
        timeout_s=settings.publish_timeout_s,
        metrics=core.metrics,
        path=settings.publish_path,
        unroutable_queue_type=settings.unroutable_queue_type,
        now=core.timekeeper.now,
        dead_connection_s=settings.dead_connection_s,
    )
