"""The AMQP side of firing: one robust connection, one channel with publisher confirms, the
exchange and its alternate exchange, and the Message built from a job (``consumers_sdk.contract``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, cast

import aio_pika
import aiormq
import pamqp.frame
import pamqp.header
from aio_pika.abc import AbstractChannel, AbstractRobustConnection, FieldValue

from consumers_sdk import contract, failover, topology, validation
from dispatcher import errors, metrics, models
from dispatcher.amqp import frames
from dispatcher.timing.kinds import NodeTime

logger = logging.getLogger(__name__)

MIN_EXPIRATION = timedelta(milliseconds=1)
PERSISTENT = 2  # delivery_mode
# The pace of the supervisor's restarts while the broker does not answer (the loop's task row).
RECONNECT_FIRST_S = 0.4
RECONNECT_MAX_S = 5.0
# auto: framed batches when ``frames.supported`` says so, else one publish per message.
PublishPath = Literal["auto", "framed", "per_message"]
_Unpublishable = list[tuple[models.Claimed, str]]  # each with the reason


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
        amqp_urls: failover.Urls,
        *,
        exchange: str,
        unroutable_exchange: str,
        connection_name: str,
        timeout_s: float,
        metrics: metrics.Metrics,
        path: PublishPath = "auto",
        unroutable_queue_type: topology.QueueType = "quorum",
        now: NodeTime,
        dead_connection_s: float | None = None,
    ) -> None:
        """DEAD_CONNECTION_S: a connection whose data goes unacknowledged that long is dropped,
        and each attempt to connect, reconnects included, takes at most that long (one begun
        while the broker's path dropped packets would otherwise wait for the kernel's SYN
        retries, two minutes, well past the path's return)."""
        self._urls = amqp_urls
        self._dead_connection_s = dead_connection_s
        self._now = now  # the node's time: what a message's remaining time to live counts from
        self._parked = topology.parked_queues(unroutable_exchange, unroutable_queue_type)
        self._exchange_name = exchange
        self._unroutable_name = unroutable_exchange
        self._connection_name = connection_name
        self._timeout_s = timeout_s
        self._metrics = metrics
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._probe_channel: AbstractChannel | None = None  # ``probe``'s own
        self._opened = asyncio.Event()
        self._renewing = asyncio.Lock()
        self._standing: dict[str, topology.Arguments] = {}  # the queue arguments declared
        self._requested_path = path
        self._chosen_for: aiormq.Channel | None = None  # the underlying channel path was chosen on
        self._frames: frames.Frames | None = None  # None: one publish per message
        self.path: Literal["framed", "per_message"] | None = None  # None: not connected yet
        self.fallback_reason: str | None = None

    async def run(self) -> None:
        """Connect; afterwards aio-pika reconnects by itself. Raises ``BrokerUnavailable`` when
        the broker does not answer (nothing is held yet): the supervisor runs it again."""
        if self._connection is None:
            try:
                await self._connect()
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
                raise errors.BrokerUnavailable(f"RabbitMQ not reachable ({exc})") from exc
        self._opened.set()

    async def _connect(self) -> None:
        # Declared first over a connection of its own: a queue an earlier release declared
        # classic is kept as it stands (a refused redeclaration would close the robust channel).
        self._standing = await topology.declare(
            self._urls, self._parked, connection_name=f"{self._connection_name}-declare"
        )
        # On a cluster a lost node's publishes in flight fail (re-fired later, at least once)
        # and the connection moves to the next node; the robust channel redeclares on it.
        connection = await failover.connect_robust(
            self._urls,
            connection_name=self._connection_name,
            connect_timeout_s=self._dead_connection_s or failover.CONNECT_TIMEOUT_S,
            dead_connection_s=self._dead_connection_s,
        )
        try:
            self._channel = await self._open_channel(connection)
        except BaseException:
            await connection.close()
            raise
        self._connection = connection
        logger.info("connected to RabbitMQ", extra={"action": "amqp_connected"})

    async def _open_channel(self, connection: AbstractRobustConnection) -> AbstractChannel:
        """A confirming channel with the exchanges and the unroutable queue declared on it (a
        robust channel declares them again after a reconnect)."""
        channel = await connection.channel(publisher_confirms=True)
        unroutable = await channel.declare_exchange(
            self._unroutable_name, aio_pika.ExchangeType.FANOUT, durable=True
        )
        parked = await channel.declare_queue(
            self._unroutable_name, durable=True, arguments=self._standing[self._unroutable_name]
        )
        await parked.bind(unroutable)
        await channel.declare_exchange(
            self._exchange_name,
            aio_pika.ExchangeType.TOPIC,
            durable=True,
            arguments=dict[str, FieldValue](contract.exchange_arguments(self._unroutable_name)),
        )
        self._choose_path(cast(aiormq.Channel, await channel.get_underlay_channel()))
        return channel

    async def _renew_channel(self, nacked_on: AbstractChannel) -> None:
        """A fresh channel after a nack. RabbitMQ (3.10 at least) can go on refusing every
        publish on a channel whose first publish to a quorum queue came while the queue's leader
        was being elected; a new channel is not affected. Publishes in flight on the old channel
        fail and are fired again."""
        async with self._renewing:
            connection = self._connection
            if nacked_on is not self._channel or connection is None or not self.is_ready():
                return  # renewed already by another batch, or reconnecting anyway
            try:
                fresh = await asyncio.wait_for(self._open_channel(connection), self._timeout_s)
            except (TimeoutError, aiormq.exceptions.AMQPError) as exc:
                logger.warning("channel not renewed after a nack: %r", exc)
                return
            self._channel = fresh
            logger.info("new channel after a nack", extra={"action": "channel_renewed"})
            with contextlib.suppress(Exception):
                await nacked_on.close()

    def _choose_path(self, amqp: aiormq.Channel) -> None:
        """Framed batches or one publish per message, for this underlying channel; a change of
        path is logged (once per change, not per reconnect) and shown by a gauge and /readyz."""
        if self._requested_path == "per_message":
            reason: str | None = "DISPATCHER_PUBLISH_PATH=per_message"
        else:
            reason = frames.supported(amqp)
            if reason is not None and self._requested_path == "framed":
                raise errors.FramedPublishUnsupported(
                    f"DISPATCHER_PUBLISH_PATH=framed, but {reason}"
                )
        self._chosen_for = amqp
        self._frames = frames.Frames(amqp, self._exchange_name) if reason is None else None
        path: Literal["framed", "per_message"] = "framed" if reason is None else "per_message"
        self._metrics.publish_framed.set(1 if reason is None else 0)
        if (path, reason) != (self.path, self.fallback_reason) and reason is not None:
            forced = self._requested_path == "per_message"
            logger.log(
                logging.INFO if forced else logging.WARNING,
                "publishing one message at a time (slower than framed batches): %s",
                reason,
                extra={"action": "publish_path"},
            )
        self.path, self.fallback_reason = path, reason

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._probe_channel = None
        self._chosen_for = self._frames = None  # the path stays shown until the next connect
        self._opened.clear()
        if connection is not None:
            await connection.close()

    def is_ready(self) -> bool:
        connection = self._connection
        return connection is not None and connection.connected.is_set()

    async def probe(self, timeout_s: float) -> str | None:
        """One round trip to the broker on this connection: None when it answered within
        TIMEOUT_S, else why not. A connection whose packets no longer arrive looks open until
        the heartbeat gives up; this notices within TIMEOUT_S. On a channel of its own (a
        ``basic.qos``, which nothing reads): whatever a round trip cut short by the timeout does
        to it, publishing is not touched; a channel that closed is opened again."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.wait_ready()  # (re)connecting: a connection made meanwhile will do
                connection = self._connection
                assert connection is not None
                channel = self._probe_channel
                if channel is None or channel.is_closed:
                    channel = self._probe_channel = await connection.channel(
                        publisher_confirms=False
                    )
                await channel.set_qos(prefetch_count=0)
        except TimeoutError:
            if not self.is_ready():
                return "not connected to RabbitMQ"
            return f"RabbitMQ did not answer a round trip within {timeout_s:g} s"
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError) as exc:
            return f"a round trip to RabbitMQ failed: {exc!r}"
        return None

    async def wait_ready(self) -> None:
        await self._opened.wait()
        assert self._connection is not None
        await self._connection.connected.wait()

    async def publish_many(self, jobs: Sequence[models.Claimed]) -> Outcome:
        """Publish all at once and wait for the confirms.

        The whole batch is framed in one piece and handed to the connection's writer in one
        write under the channel's lock, taking consecutive delivery tags (``frames.Frames``);
        where aiormq cannot be trusted with that, every message is published on its own and
        their confirms are awaited together. Only the broker's confirm makes a publish count;
        the batch is bounded by the caller.
        """
        channel = self._channel
        if channel is None or not self.is_ready():
            return Outcome(failed=list(jobs))
        try:
            # The robust channel swaps its underlying channel on reconnect: ask every batch.
            underlay = await asyncio.wait_for(channel.get_underlay_channel(), self._timeout_s)
            amqp = cast(aiormq.Channel, underlay)
            if amqp is not self._chosen_for:
                self._choose_path(amqp)
            now = datetime.fromtimestamp(self._now(), UTC)
            if self._frames is None:
                sent, confirmations, unpublishable = self._publish_each(amqp, jobs, now)
            else:
                framed = self._frames.frame(jobs, lambda job: message_properties(job, now))
                confirmations = await asyncio.wait_for(self._frames.send(framed), self._timeout_s)
                sent, unpublishable = framed.jobs, framed.unpublishable
        except (
            TimeoutError,
            aiormq.exceptions.AMQPError,
            aiormq.exceptions.ChannelInvalidStateError,  # closed meanwhile; not an AMQPError
        ) as exc:
            logger.warning("no channel to publish on: %r", exc, extra={"action": "publish_failed"})
            self._metrics.publish_failures.inc(len(jobs))
            return Outcome(failed=list(jobs))
        outcome = Outcome(unpublishable=unpublishable)
        if confirmations:
            try:
                await asyncio.wait(confirmations, timeout=self._timeout_s)
            finally:  # timed out, or cancelled: leave no publish task running unowned
                pending = [future for future in confirmations if not future.done()]
                for future in pending:
                    future.cancel()  # a late confirm of a cancelled one is ignored (aiormq logs it)
            if pending:
                await asyncio.wait(pending)  # a cancelled publish task ends (gives its tag back)
        for job, future in zip(sent, confirmations, strict=True):
            if not future.done() or future.cancelled():
                outcome.failed.append(job)
            elif isinstance(future.exception(), aiormq.exceptions.DeliveryError):
                outcome.nacked.append(job)  # the broker refused this message, not the channel
            elif future.exception() is not None:
                outcome.failed.append(job)
            else:
                outcome.confirmed.append(job)
        self._count(outcome, confirmations)
        if outcome.nacked:
            await self._renew_channel(channel)
        return outcome

    def _count(self, outcome: Outcome, confirmations: list[asyncio.Future[object]]) -> None:
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

    def _publish_each(
        self, amqp: aiormq.Channel, jobs: Sequence[models.Claimed], now: datetime
    ) -> tuple[list[models.Claimed], list[asyncio.Future[object]], _Unpublishable]:
        """aiormq's public publish, one task per message, all started before any confirm is
        awaited (tasks take the channel's lock in order: each routing key keeps the batch's
        order). Not mandatory, as framed: the alternate exchange takes what no queue does."""
        sent: list[models.Claimed] = []
        confirmations: list[asyncio.Future[object]] = []
        unpublishable: _Unpublishable = []
        for job in jobs:
            try:
                properties = message_properties(job, now)
                # Encoded here, not inside the task: one bad job is parked, as framed, and is
                # never confused with a failure of the channel.
                method = aiormq.spec.Basic.Publish(
                    exchange=self._exchange_name, routing_key=job.routing_key
                )
                pamqp.frame.marshal(method, amqp.number)
                pamqp.frame.marshal(
                    pamqp.header.ContentHeader(body_size=len(job.payload), properties=properties),
                    amqp.number,
                )
            except Exception as exc:
                unpublishable.append((job, frames.unencodable(exc)))
                continue
            publish = amqp.basic_publish(
                job.payload,
                exchange=self._exchange_name,
                routing_key=job.routing_key,
                properties=properties,
                wait=False,  # the confirm is what counts, not the socket write
            )
            confirmations.append(asyncio.ensure_future(publish))
            sent.append(job)
        return sent, confirmations, unpublishable


@dataclass(slots=True)
class Outcome:
    """What became of a batch handed to ``publish_many``: each job is in one list."""

    confirmed: list[models.Claimed] = field(default_factory=list)
    failed: list[models.Claimed] = field(default_factory=list)  # no confirm: retry later
    nacked: list[models.Claimed] = field(default_factory=list)  # the broker refused the message
    # Jobs no AMQP message can be made of, with the reason (never sent).
    unpublishable: list[tuple[models.Claimed, str]] = field(default_factory=list)
