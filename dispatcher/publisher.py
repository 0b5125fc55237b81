"""The AMQP side of firing: one robust connection, one channel with publisher confirms, the
exchange and its alternate exchange, and the Message built from a job (``consumers_sdk.contract``).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import cast

import aio_pika
import aiormq
import pamqp.constants
import pamqp.frame
import pamqp.header
from aio_pika.abc import AbstractChannel, AbstractRobustConnection, FieldValue
from aiormq.abc import ChannelFrame

from consumers_sdk import connections, contract, validation
from dispatcher import metrics, models

logger = logging.getLogger(__name__)

MIN_EXPIRATION = timedelta(milliseconds=1)
PERSISTENT = 2  # delivery_mode
RECONNECT_MAX_S = 5.0
MAX_CACHED_ROUTES = 10_000  # Basic.Publish frames kept, one per routing key
_BODY_FRAME_HEADER = struct.Struct(">BHI")  # frame type, channel, size


def message_properties(job: models.Claimed, now: datetime) -> aiormq.spec.Basic.Properties:
    """The message contract (see ``consumers_sdk.contract``): everything but the body."""
    job_id = str(job.id)
    expires_at = job.expires_at
    expiration = None
    if expires_at is not None:
        remaining_ms = int(max(expires_at - now, MIN_EXPIRATION) / MIN_EXPIRATION)
        # RabbitMQ refuses a longer expiration by closing the channel, which would fail every
        # publish in flight on it: past the cap the message keeps the longest one allowed.
        expiration = str(min(remaining_ms, validation.MAX_TTL_MS))
    headers = contract.message_headers(
        job_id=job_id,
        run_at=job.run_at,
        idempotency_key=job.idempotency_key,
        user_headers=job.headers,
        dispatch_round=str(job.dispatch_round),
    )
    return aiormq.spec.Basic.Properties(
        content_type=contract.CONTENT_TYPE,
        delivery_mode=PERSISTENT,
        message_id=job_id,
        timestamp=now,
        priority=job.priority,
        expiration=expiration,
        headers=cast(dict[str, FieldValue], headers),  # a fresh dict: no copy needed
    )


class Publisher:
    """Connects (and keeps reconnecting) in ``run``; ``publish_many`` pipelines confirms."""

    def __init__(
        self,
        amqp_url: str,
        *,
        exchange: str,
        unroutable_exchange: str,
        connection_name: str,
        timeout_s: float,
        metrics: metrics.Metrics,
    ) -> None:
        self._url = amqp_url
        self._exchange_name = exchange
        self._unroutable_name = unroutable_exchange
        self._connection_name = connection_name
        self._timeout_s = timeout_s
        self._metrics = metrics
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._opened = asyncio.Event()
        self._frames: _Frames | None = None

    async def run(self) -> None:
        """Connect, retrying until the broker answers; afterwards aio-pika reconnects by itself."""
        failures = 0
        while self._connection is None:
            try:
                await self._connect()
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
                failures += 1
                delay = min(0.2 * 2**failures, RECONNECT_MAX_S)
                logger.warning("RabbitMQ not reachable (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
        self._opened.set()

    async def _connect(self) -> None:
        connection = await connections.opened(
            lambda: aio_pika.connect_robust(
                self._url,
                client_properties={"connection_name": self._connection_name},
                reconnect_interval=1.0,
            )
        )
        try:
            channel = await connection.channel(publisher_confirms=True)
            unroutable = await channel.declare_exchange(
                self._unroutable_name, aio_pika.ExchangeType.FANOUT, durable=True
            )
            parked = await channel.declare_queue(self._unroutable_name, durable=True)
            await parked.bind(unroutable)
            await channel.declare_exchange(
                self._exchange_name,
                aio_pika.ExchangeType.TOPIC,
                durable=True,
                arguments=dict[str, FieldValue](contract.exchange_arguments(self._unroutable_name)),
            )
        except BaseException:
            await connection.close()
            raise
        self._channel = channel
        self._connection = connection
        logger.info("connected to RabbitMQ", extra={"action": "amqp_connected"})

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = None
        self._opened.clear()
        if connection is not None:
            await connection.close()

    def is_ready(self) -> bool:
        connection = self._connection
        return connection is not None and connection.connected.is_set()

    async def wait_ready(self) -> None:
        await self._opened.wait()
        assert self._connection is not None
        await self._connection.connected.wait()

    async def publish_many(self, jobs: Sequence[models.Claimed]) -> Outcome:
        """Publish all at once and wait for the confirms.

        The whole batch is framed in one piece and handed to the connection's writer in one
        write under the channel's lock, taking consecutive delivery tags (``_Frames``): a
        publish at a time costs a lock, a timeout scope, a task and a socket write per message,
        which took more CPU than the rest of firing together (py-spy). Only the broker's
        confirm makes a publish count; the batch is bounded by the caller.
        """
        channel = self._channel
        if channel is None or not self.is_ready():
            return Outcome(failed=list(jobs))
        try:
            # The robust channel swaps its underlying channel on reconnect: ask every batch.
            underlay = await asyncio.wait_for(channel.get_underlay_channel(), self._timeout_s)
            amqp = cast(aiormq.Channel, underlay)
            if self._frames is None or self._frames.channel is not amqp:
                self._frames = _Frames(amqp, self._exchange_name)
            framed = self._frames.frame(jobs, datetime.now(UTC))
            confirmations = await asyncio.wait_for(self._frames.send(framed), self._timeout_s)
        except (
            TimeoutError,
            aiormq.exceptions.AMQPError,
            aiormq.exceptions.ChannelInvalidStateError,  # closed meanwhile; not an AMQPError
        ) as exc:
            logger.warning("no channel to publish on: %r", exc, extra={"action": "publish_failed"})
            self._metrics.publish_failures.inc(len(jobs))
            return Outcome(failed=list(jobs))
        outcome = Outcome(unpublishable=framed.unpublishable)
        if confirmations:
            _, pending = await asyncio.wait(confirmations, timeout=self._timeout_s)
            for future in pending:
                future.cancel()  # a late confirm of a cancelled one is ignored (aiormq logs it)
        for job, future in zip(framed.jobs, confirmations, strict=True):
            if not future.done() or future.cancelled():
                outcome.failed.append(job)
            elif isinstance(future.exception(), aiormq.exceptions.DeliveryError):
                outcome.nacked.append(job)  # the broker refused this message, not the channel
            elif future.exception() is not None:
                outcome.failed.append(job)
            else:
                outcome.confirmed.append(job)
        self._metrics.publish_confirms.inc(len(outcome.confirmed))
        if not_confirmed := len(outcome.failed) + len(outcome.nacked):
            self._metrics.publish_failures.inc(not_confirmed)
            first = next(
                (f for f in confirmations if f.done() and not f.cancelled() and f.exception()),
                None,
            )
            logger.warning(
                "%d publishes not confirmed (%s)",
                not_confirmed,
                first.exception() if first else "timeout",
                extra={"action": "publish_failed"},
            )
        return outcome


@dataclass(slots=True)
class Outcome:
    """What became of a batch handed to ``publish_many``: each job is in one list."""

    confirmed: list[models.Claimed] = field(default_factory=list)
    failed: list[models.Claimed] = field(default_factory=list)  # no confirm: retry later
    nacked: list[models.Claimed] = field(default_factory=list)  # the broker refused the message
    # Jobs no AMQP message can be made of, with the reason (never sent).
    unpublishable: list[tuple[models.Claimed, str]] = field(default_factory=list)


@dataclass(slots=True)
class _Framed:
    """A batch framed for one write: the jobs it holds, in delivery-tag order."""

    payload: bytes
    jobs: list[models.Claimed]
    unpublishable: list[tuple[models.Claimed, str]]


class _Frames:
    """Frames a batch of publishes on one aiormq channel as one write.

    It keeps aiormq's own bookkeeping: under the channel's lock each message takes the next
    delivery tag and a confirmation future registered where the channel's reader resolves it
    (ack, nack, or the channel's close rejecting it). A write that never reached the writer's
    queue gives its tags back, as ``Channel.basic_publish`` does, so the broker's count of
    publishes and ours stay the same.
    """

    def __init__(self, channel: aiormq.Channel, exchange: str) -> None:
        self.channel = channel
        self._exchange = exchange
        self._publish_frames: dict[str, bytes] = {}  # routing key -> its Basic.Publish frame
        self._max_body = channel.max_content_size

    def _publish_frame(self, routing_key: str) -> bytes:
        frame = self._publish_frames.get(routing_key)
        if frame is None:
            if len(self._publish_frames) > MAX_CACHED_ROUTES:
                self._publish_frames.clear()
            method = aiormq.spec.Basic.Publish(exchange=self._exchange, routing_key=routing_key)
            frame = self._publish_frames[routing_key] = pamqp.frame.marshal(
                method, self.channel.number
            )
        return frame

    def _body_frames(self, body: bytes) -> list[bytes]:
        number = self.channel.number
        return [
            _BODY_FRAME_HEADER.pack(pamqp.constants.FRAME_BODY, number, len(chunk))
            + chunk
            + pamqp.constants.FRAME_END_CHAR
            for chunk in (
                body[at : at + self._max_body] for at in range(0, len(body), self._max_body)
            )
        ]

    def frame(self, jobs: Sequence[models.Claimed], now: datetime) -> _Framed:
        """Each job's frames, joined; a job whose message cannot be encoded is left out (one
        such job must not stop its batch, or every batch it is retried in)."""
        number = self.channel.number
        parts: list[bytes] = []
        framed: list[models.Claimed] = []
        unpublishable: list[tuple[models.Claimed, str]] = []
        for job in jobs:
            try:
                header = pamqp.header.ContentHeader(
                    body_size=len(job.payload), properties=message_properties(job, now)
                )
                frames = [
                    self._publish_frame(job.routing_key),
                    pamqp.frame.marshal(header, number),
                    *self._body_frames(job.payload),
                ]
            except Exception as exc:
                unpublishable.append((job, f"cannot be encoded as an AMQP message: {exc!r}"))
                continue
            parts.extend(frames)
            framed.append(job)
        return _Framed(b"".join(parts), framed, unpublishable)

    async def send(self, framed: _Framed) -> list[asyncio.Future[object]]:
        if not framed.jobs:
            return []
        channel = self.channel
        frame = ChannelFrame(payload=framed.payload, should_close=False)
        count = len(framed.jobs)
        async with channel.lock:
            first_tag = channel.delivery_tag + 1
            confirmations: list[asyncio.Future[object]] = []
            for tag in range(first_tag, first_tag + count):
                future = channel.create_future()
                channel.confirmations[tag] = future
                confirmations.append(future)
            channel.delivery_tag += count
            try:
                await channel.write_queue.put(frame)
            except BaseException:
                # Not handed to the writer: the broker never sees these tags.
                channel.delivery_tag -= count
                for tag, future in enumerate(confirmations, start=first_tag):
                    channel.confirmations.pop(tag, None)
                    future.cancel()
                raise
        return confirmations
