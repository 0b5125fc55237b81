"""The AMQP side of firing: one robust connection, one channel with publisher confirms, the
exchange and its alternate exchange, and the Message built from a job (``consumers_sdk.contract``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection, FieldValue

from consumers_sdk import contract
from dispatcher import metrics, models

logger = logging.getLogger(__name__)

MIN_EXPIRATION = timedelta(milliseconds=1)
PERSISTENT = 2  # delivery_mode
RECONNECT_MAX_S = 5.0


def message_properties(job: models.Claimed, now: datetime) -> aiormq.spec.Basic.Properties:
    """The message contract (see ``consumers_sdk.contract``): everything but the body."""
    job_id = str(job.id)
    expires_at = job.expires_at
    expiration = None
    if expires_at is not None:
        remaining = max(expires_at - now, MIN_EXPIRATION)
        expiration = str(int(remaining / MIN_EXPIRATION))
    headers = contract.message_headers(
        job_id=job_id,
        run_at=job.run_at,
        idempotency_key=job.idempotency_key,
        user_headers=job.headers,
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
        connection = await aio_pika.connect_robust(
            self._url,
            client_properties={"connection_name": self._connection_name},
            reconnect_interval=1.0,
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

    async def publish_many(
        self, jobs: Sequence[models.Claimed]
    ) -> tuple[list[models.Claimed], list[models.Claimed]]:
        """Publish all at once and wait for the confirms: (confirmed, not confirmed).

        Publishes go straight to the channel's aiormq layer without waiting for a socket drain
        per message (``wait=False``): the batch is bounded by the caller, and only the broker's
        confirm makes a publish count. aio-pika's Message and Exchange wrappers cost more CPU per
        message than the rest of firing together (measured with py-spy).
        """
        channel = self._channel
        if channel is None or not self.is_ready():
            return [], list(jobs)
        try:
            # The robust channel swaps its underlying channel on reconnect: ask every batch.
            underlay = await asyncio.wait_for(channel.get_underlay_channel(), self._timeout_s)
            # The concrete channel: its basic_publish takes ``wait``, which the ABC omits.
            amqp = cast(aiormq.Channel, underlay)
        except (TimeoutError, aiormq.exceptions.AMQPError) as exc:
            logger.warning("no channel to publish on: %r", exc, extra={"action": "publish_failed"})
            self._metrics.publish_failures.inc(len(jobs))
            return [], list(jobs)
        now = datetime.now(UTC)
        tasks = [
            asyncio.ensure_future(
                amqp.basic_publish(
                    job.payload,
                    exchange=self._exchange_name,
                    routing_key=job.routing_key,
                    properties=message_properties(job, now),
                    wait=False,
                )
            )
            for job in jobs
        ]
        done, pending = await asyncio.wait(tasks, timeout=self._timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        confirmed: list[models.Claimed] = []
        failed: list[models.Claimed] = []
        for job, task in zip(jobs, tasks, strict=True):
            if task in done and not task.cancelled() and task.exception() is None:
                confirmed.append(job)
            else:
                failed.append(job)
        self._metrics.publish_confirms.inc(len(confirmed))
        if failed:
            self._metrics.publish_failures.inc(len(failed))
            first = next(
                (t for t in tasks if t.done() and not t.cancelled() and t.exception()), None
            )
            logger.warning(
                "%d publishes not confirmed (%s)",
                len(failed),
                first.exception() if first else "timeout",
                extra={"action": "publish_failed"},
            )
        return confirmed, failed
