"""The events consumer: records what consumers report about each attempt (``contract.JobEvent``) so
that a job's history and final state (``succeeded``/``dead``) live in PostgreSQL. Only an event of
the job's current dispatch round and routing key counts; the others are recorded as ignored, with
the reason, and counted in ``dispatcher_events_ignored_total{reason}``.

Every node consumes the one shared quorum queue ``contract.EVENTS_QUEUE`` (competing consumers) on
a connection of its own. Deliveries (each an array of events, or one event) are batched (up to
``batch`` of them, or whatever arrived within ``LINGER_S``), their events recorded ``batch`` to a
round trip, then acked together: a crash before the ack redelivers them, and recording is
idempotent on the event id, so at-least-once delivery records each event once. While PostgreSQL is
unreachable the batch stays unacked and is retried with backoff inside (a restart would have the
broker redeliver it, counting against the queue's delivery limit), and the loop reports itself
degraded to its supervisor meanwhile. A broker not there at connect (nothing held yet) reaches the
supervisor as ``BrokerUnavailable`` instead.

What one node holds is bounded: at most ``prefetch`` messages unacked, each read only when it is
at most ``max_message_bytes`` (a larger one is acked unread and counted in
``dispatcher_events_dropped_total{reason}``), so at most ``prefetch`` x ``max_message_bytes`` of
bodies wait; what is logged of a refused message is cut to ``LOGGED_CHARS``. Each event goes to
the store with its message's ``user_id`` (RabbitMQ checks it names the publishing user), which
``DISPATCHER_EVENT_USERS`` grants jobs to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from consumers_sdk import contract, failover, topology
from dispatcher import errors, metrics, supervision
from dispatcher.store import history

logger = logging.getLogger(__name__)

LINGER_S = 0.05
# Recording retried while PostgreSQL is away; also the pace of the loop's restarts (its task row).
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0
# A refused message's reason, as logged: a consumer's text (an outcome, a date) may be megabytes.
LOGGED_CHARS = 200

Reported = tuple[contract.JobEvent, str | None]  # an event and the user that published it


def cut(text: str, limit: int = LOGGED_CHARS) -> str:
    """``text`` within ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class EventsConsumer:
    def __init__(
        self,
        amqp_url: failover.Urls,
        *,
        store: history.HistoryStore,
        metrics: metrics.Metrics,
        connection_name: str,
        batch: int = 500,
        prefetch: int = 64,
        max_message_bytes: int = 256 * 1024,
        stats_interval_s: float = 15.0,
        dead_connection_s: float | None = None,
    ) -> None:
        self._url = amqp_url
        self._dead_connection_s = dead_connection_s  # as ``Publisher``'s
        self._stats_interval_s = stats_interval_s
        self._store = store
        self._metrics = metrics
        self._connection_name = connection_name
        self._batch = batch
        self._prefetch = prefetch
        self._max_message_bytes = max_message_bytes
        self._inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._connection: AbstractRobustConnection | None = None
        self.recorded = 0

    async def run(self) -> None:
        """Connect (aio-pika heals later losses), consume and record until cancelled. Raises
        ``BrokerUnavailable`` when the broker does not answer: the supervisor runs it again."""
        try:
            self._connection = await self._connect()
        except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
            raise errors.BrokerUnavailable(f"RabbitMQ not reachable ({exc!r})") from exc
        counting = asyncio.create_task(self._count_dead_letters_every(), name="events-dead-count")
        try:
            while True:
                await self._record(await self._next_batch())
        finally:
            counting.cancel()
            connection, self._connection = self._connection, None
            # Waited for a while, never awaited: a close that swallows a cancel (aiormq's may)
            # or a count stuck on a dead socket must not hold this task, and the node's stop
            # with it (this task's own cancellation still ends the wait at once).
            closing = asyncio.ensure_future(_closed(connection))
            await asyncio.wait({counting, closing}, timeout=CLOSE_WAIT_S)

    async def _connect(self) -> AbstractRobustConnection:
        standing = await topology.declare(
            self._url, topology.events_queues, connection_name=f"{self._connection_name}-declare"
        )
        connection = await failover.connect_robust(
            self._url,
            connection_name=self._connection_name,
            connect_timeout_s=self._dead_connection_s or failover.CONNECT_TIMEOUT_S,
            dead_connection_s=self._dead_connection_s,
        )
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self._prefetch)
            # Redeclared as it stands on the robust channel, which restores it after a reconnect.
            queue = await channel.declare_queue(
                contract.EVENTS_QUEUE, durable=True, arguments=standing[contract.EVENTS_QUEUE]
            )
            await queue.consume(self._deliver)
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _count_dead_letters_every(self) -> None:
        while True:
            try:
                await self.count_dead_letters()
            except Exception:  # a gauge must not end the counting, nor go unseen
                logger.exception("events: dead letters not counted")
            await asyncio.sleep(self._stats_interval_s)

    async def count_dead_letters(self) -> int | None:
        """Events waiting in ``dispatcher.events.dead`` (refused, or redelivered past the limit);
        None while the broker cannot say."""
        connection = self._connection
        if connection is None or connection.is_closed:
            return None
        try:
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(
                    topology.EVENTS_DEAD_QUEUE, passive=True, robust=False
                )
                count = queue.declaration_result.message_count or 0
            finally:
                await channel.close()
        except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
            logger.info("events: dead letters not counted (%r)", exc)
            return None
        self._metrics.events_dead_letters.set(count)
        return count

    async def _deliver(self, message: AbstractIncomingMessage) -> None:
        if message.body_size > self._max_message_bytes:
            await self._drop(message, "too_large")
            return
        self._inbox.put_nowait(message)  # bounded by the prefetch

    async def _drop(self, message: AbstractIncomingMessage, reason: str) -> None:
        """Ack a message unread: sent to .dead it would keep its bytes in the broker, and
        requeued it would come back forever. A batch's multiple ack later passes over it."""
        self._metrics.events_dropped.labels(reason=reason).inc()
        logger.warning(
            "events: dropped a message of %d bytes (%s, at most %d are read) from user %s",
            message.body_size,
            reason,
            self._max_message_bytes,
            cut(str(message.user_id), 64),
        )
        try:
            await message.ack()
        except Exception as exc:  # the channel is gone: it comes back, and is dropped again
            logger.info("events: dropped message not acked (%r)", exc)

    async def _next_batch(self) -> list[AbstractIncomingMessage]:
        # No more messages than the prefetch lets arrive before this batch is acked.
        most = min(self._batch, self._prefetch)
        batch = [await self._inbox.get()]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while len(batch) < most:
                    batch.append(await self._inbox.get())
        return batch

    async def _record(self, batch: list[AbstractIncomingMessage]) -> None:
        decoded: list[tuple[AbstractIncomingMessage, contract.JobEvent]] = []
        refused: list[AbstractIncomingMessage] = []
        for message in batch:
            try:
                events = contract.decode_events(message.body)
            except ValueError as exc:
                reason = cut(str(exc))
                logger.warning("events: refused a message that is not job events: %s", reason)
                refused.append(message)
                continue
            decoded.extend((message, event) for event in events)
        recorded: list[history.Recorded] = []
        unrecordable: list[contract.JobEvent] = []
        # A message holds up to contract.EVENTS_PER_MESSAGE events: statements stay bounded.
        for start in range(0, len(decoded), self._batch):
            chunk = [
                (event, message.user_id) for message, event in decoded[start : start + self._batch]
            ]
            stored, refused_events = await self._store_retrying(chunk)
            recorded.extend(stored)
            unrecordable.extend(refused_events)
        # A message with an event PostgreSQL refused goes to .dead whole: its other events are
        # recorded already, and recording them again once it is requeued changes nothing.
        unrecordable_ids = {id(event) for event in unrecordable}
        spoilt = {
            id(message): message for message, event in decoded if id(event) in unrecordable_ids
        }
        refused.extend(spoilt.values())
        # Counted per label set, not per event: a label lookup costs more than the rest of it.
        ignored = Counter(entry.ignored for entry in recorded if entry.ignored is not None)
        outcomes = Counter(
            (entry.event.outcome, entry.event.routing_key)
            for entry in recorded
            if entry.ignored is None  # forged or stale: not an outcome of the job
        )
        for reason, count in ignored.items():
            self._metrics.events_ignored.labels(reason=reason).inc(count)
        for (outcome, routing_key), count in outcomes.items():
            self._metrics.consumer_outcomes.labels(
                outcome=outcome, routing_key=self._metrics.key_label(routing_key)
            ).inc(count)
        self.recorded += len(recorded)
        await self._settle(batch, refused)

    async def _settle(
        self, batch: list[AbstractIncomingMessage], refused: list[AbstractIncomingMessage]
    ) -> None:
        """Refused events go to ``dispatcher.events.dead`` (the queue's dead-letter route), where
        they are counted and can be requeued once their cause is fixed; the rest are acked."""
        try:
            for message in refused:
                await message.reject(requeue=False)
                self._metrics.events_refused.inc()
            refused_ids = {id(message) for message in refused}
            kept = [message for message in batch if id(message) not in refused_ids]
            if kept:
                # Deliveries of one channel arrive in order, so the last one acks the others.
                await kept[-1].ack(multiple=True)
        except Exception as exc:
            # The channel is gone: the broker redelivers them, and recording is idempotent.
            logger.info("events: batch not settled (%r); it will be redelivered", exc)

    async def _store_retrying(
        self, reported: list[Reported]
    ) -> tuple[list[history.Recorded], list[contract.JobEvent]]:
        """(recorded, refused): retried while PostgreSQL is away. An event PostgreSQL refuses
        would come back forever (and stop every node in turn): the batch is recorded one by one
        without it, and so is one that makes recording fail for any reason but the database
        being away."""
        events = [event for event, _ in reported]
        try:
            return await self._record_when_up(events, [user for _, user in reported]), []
        except Exception as exc:  # InvalidEvent, or a bug one event triggers
            if len(events) == 1:
                logger.warning(
                    "events: refused %s (job %s) to %s: %s",
                    events[0].event_id,
                    events[0].job_id,
                    topology.EVENTS_DEAD_QUEUE,
                    cut(repr(exc)),
                    exc_info=not isinstance(exc, errors.InvalidEvent),
                )
                return [], events
            recorded: list[history.Recorded] = []
            refused: list[contract.JobEvent] = []
            for one in reported:
                one_recorded, one_refused = await self._store_retrying([one])
                recorded.extend(one_recorded)
                refused.extend(one_refused)
            return recorded, refused

    async def _record_when_up(
        self, events: list[contract.JobEvent], users: list[str | None]
    ) -> list[history.Recorded]:
        """``store.record``, retried while PostgreSQL is away: the loop reports itself degraded
        meanwhile, and recovered once PostgreSQL answers (records, or refuses: raised)."""
        backoff = supervision.Backoff(first_s=RETRY_FIRST_S, max_s=RETRY_MAX_S)
        try:
            while True:
                try:
                    return await self._store.record(events, users)
                except errors.StoreUnavailable as exc:
                    delay = backoff.next()
                    supervision.report_degraded("recording", exc)
                    logger.warning("events: not recorded (%s); retrying in %.1fs", exc, delay)
                    await asyncio.sleep(delay)
        finally:
            if backoff.failures:
                supervision.report_recovered("recording")


# How long the consumer's end waits for its connection to close.
CLOSE_WAIT_S = 5.0


async def _closed(connection: AbstractRobustConnection) -> None:
    with contextlib.suppress(Exception):
        await connection.close()
