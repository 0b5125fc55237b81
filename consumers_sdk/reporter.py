"""Reports each attempt's outcome to the dispatcher (``contract.EVENTS_EXCHANGE``) in the
background: handlers never wait for it and never fail because of it.

Each message holds events of one routing key (the job's, which is also the message's routing key,
so that a topic permission can hold a user to its own keys) within
``contract.EVENTS_MESSAGE_BYTES``, and names the user it was published as in ``user_id``.

``report`` only appends to a bounded buffer; ``run`` publishes the buffer with publisher confirms
on a connection of its own (a connection RabbitMQ blocks, or a channel it closes for a refused
publish, must not hold up the consumer's acks). An event not confirmed stays at the head of the
buffer and is sent again after a backoff; when the buffer is full the oldest event is dropped
(counted in ``dropped``), so memory stays bounded however long the broker refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections import deque
from datetime import UTC, datetime
from typing import cast

import aiormq
from aio_pika.abc import AbstractConnection

from consumers_sdk import broker_urls, contract, failover, ids, retry, topology
from consumers_sdk.errors import TopologyMismatch

logger = logging.getLogger(__name__)

BATCH = 500  # events per round: a message per outcome among them, confirmed together
# A round short of a batch waits this long for more: at a steady rate, a message carries tens of
# events instead of one or two, for the consumer, RabbitMQ and the dispatcher alike.
LINGER_S = 0.02
PERSISTENT = 2  # delivery_mode
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0


def default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class EventReporter:
    """A bounded buffer of events and the task that publishes it; ``open``/``close`` bracket it."""

    def __init__(
        self,
        amqp_url: failover.Urls,
        *,
        group: str,
        consumer: str,
        capacity: int = 10_000,
        publish_timeout_s: float = 10.0,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._url = amqp_url
        # RabbitMQ refuses a user_id that is not the connection's: the same users on every node.
        self._user_id = broker_urls.login_user(broker_urls.parse(amqp_url)[0])
        self.group = group
        self.consumer = consumer
        self._buffer: deque[contract.JobEvent] = deque()
        self._event_ids = ids.RandomIds()
        self._capacity = capacity
        self._timeout_s = publish_timeout_s
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0  # events dropped because the buffer was full
        self.published = 0

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def report(
        self,
        *,
        job_id: str,
        routing_key: str,
        attempt: int,
        outcome: str,
        error: str | None = None,
        dispatch_round: str | None = None,
    ) -> None:
        """Queue one event about the delivery of ``dispatch_round`` (its ``x-dispatcher-round``:
        the dispatcher ignores an event without the job's current round); never blocks, never
        raises."""
        if len(self._buffer) >= self._capacity:
            self._buffer.popleft()
            self.dropped += 1
        self._buffer.append(
            contract.JobEvent(
                event_id=self._event_ids.next_text(),
                job_id=job_id,
                routing_key=routing_key,
                group=self.group,
                consumer=self.consumer,
                attempt=attempt,
                outcome=outcome,
                error=error,
                at=datetime.now(UTC),
                dispatch_round=dispatch_round,
            )
        )
        self._drained.clear()
        self._wake.set()

    def open(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"events-{self.group}")

    async def close(self, timeout_s: float) -> None:
        """Publish what is buffered for up to ``timeout_s``, then stop (the rest is lost)."""
        task, self._task = self._task, None
        if task is None:
            return
        drained = asyncio.create_task(self._drained.wait())
        await asyncio.wait([task, drained], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        drained.cancel()
        if self._buffer:
            logger.warning("%d job events not reported at stop", len(self._buffer))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        backoff = retry.Doubling(first_s=RETRY_FIRST_S, max_s=RETRY_MAX_S)
        failures = 0  # connections lost so far: the next one starts at the next node
        while True:
            connection: AbstractConnection | None = None
            try:
                connection = await failover.connect(
                    self._url,
                    connection_name=f"consumer-{self.group}-events",
                    connect_timeout_s=self._timeout_s,
                    start=failures,  # after a failure, the next node first
                )
                try:
                    await topology.declare(
                        self._url,
                        topology.events_queues,
                        connection_name=f"consumer-{self.group}-events-declare",
                    )
                except (aiormq.exceptions.ChannelAccessRefused, TopologyMismatch) as exc:
                    # A consumer's user may lack configure rights: the dispatcher declares them;
                    # and a queue declared otherwise is the dispatcher's to report, loudly: the
                    # events still reach the exchange.
                    logger.info("job events topology not declared (%r); publishing anyway", exc)
                channel = await connection.channel(publisher_confirms=True)
                # aiormq's channel, as the dispatcher's publisher does: aio-pika's Message and
                # Exchange wrappers cost more CPU per event than the rest, on the handlers' loop.
                amqp = cast(aiormq.Channel, await channel.get_underlay_channel())
                while True:
                    await self._publish_buffer(amqp)
                    backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = backoff.next()
                logger.warning("job events not reported (%r); retrying in %.1fs", exc, delay)
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close()
            await asyncio.sleep(delay)

    async def _publish_buffer(self, amqp: aiormq.Channel) -> None:
        if not self._buffer:
            self._wake.clear()
            await self._wake.wait()
        if len(self._buffer) < BATCH:
            await asyncio.sleep(LINGER_S)
        batch = [self._buffer[i] for i in range(min(BATCH, len(self._buffer)))]
        # One message per routing key among them (within contract.EVENTS_MESSAGE_BYTES), confirmed
        # together: two events per delivery sent one by one cost more than the handler's work.
        by_key: dict[str, list[contract.JobEvent]] = {}
        for event in batch:
            by_key.setdefault(event.routing_key, []).append(event)
        messages = [
            (routing_key, events, body)
            for routing_key, of_key in by_key.items()
            for events, body in contract.pack_events(of_key)
        ]
        results = await asyncio.gather(
            *(
                asyncio.wait_for(
                    amqp.basic_publish(
                        body,
                        exchange=contract.EVENTS_EXCHANGE,
                        routing_key=routing_key,
                        properties=_properties(self._user_id),
                        wait=False,
                    ),
                    self._timeout_s,
                )
                for routing_key, _, body in messages
            ),
            return_exceptions=True,
        )
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is None:
            # What is left of the round is the buffer's head: report() appends, and drops only
            # from the head when the buffer is full.
            sent = {id(event) for event in batch}
            while self._buffer and id(self._buffer[0]) in sent:
                self._buffer.popleft()
            self.published += len(batch)
        else:
            # Drop what was confirmed; the events of a failed message stay buffered (a copy may
            # still have arrived: the dispatcher records each event id once).
            confirmed = {
                id(event)
                for (_, events, _), result in zip(messages, results, strict=True)
                if not isinstance(result, BaseException)
                for event in events
            }
            kept = [event for event in self._buffer if id(event) not in confirmed]
            self._buffer.clear()
            self._buffer.extend(kept)
            self.published += len(confirmed)
        if not self._buffer:
            self._drained.set()
        if failure is not None:
            raise failure


def _properties(user_id: str | None) -> aiormq.spec.Basic.Properties:
    return aiormq.spec.Basic.Properties(
        content_type=contract.CONTENT_TYPE,
        delivery_mode=PERSISTENT,
        message_id=str(uuid.uuid4()),
        message_type=contract.EVENTS_TYPE,
        timestamp=datetime.now(UTC),
        user_id=user_id,
    )
