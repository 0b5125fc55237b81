"""The publisher against a real RabbitMQ, on both paths (a batch framed as one write, and one
publish per message): a batch arrives whole, message by message, with the contract's properties;
the channel's delivery tags stay in step; refusals and unencodable jobs are told apart. ``auto``
frames on the tested aiormq and falls back, saying so once, on any other."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

import aio_pika
import aiormq
import pytest

from consumers_sdk import contract
from devstack.jobs_out import job
from dispatcher import errors, metrics, models
from dispatcher.amqp import frames
from dispatcher.amqp.publisher import Outcome, Publisher, PublishPath

# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version


EXCHANGE = contract.EXCHANGE


@pytest.fixture(params=["framed", "per_message"])
def path(request: pytest.FixtureRequest) -> PublishPath:
    """Each test runs on both paths: framed is refused at connect where it is unsupported."""
    return cast(PublishPath, request.param)


def new_publisher(amqp_url: str, path: PublishPath) -> Publisher:
    return Publisher(
        amqp_url,
        exchange=EXCHANGE,
        unroutable_exchange="dispatcher.unroutable",
        connection_name="test-publisher",
        timeout_s=10.0,
        metrics=metrics.Metrics(),
        path=path,
        now=time.time,
    )


@asynccontextmanager
async def running(amqp_url: str, path: PublishPath) -> AsyncIterator[Publisher]:
    publisher = new_publisher(amqp_url, path)
    await publisher.run()
    try:
        yield publisher
    finally:
        await publisher.close()


async def bound_queue(
    channel: aio_pika.abc.AbstractChannel, routing_key: str
) -> aio_pika.abc.AbstractQueue:
    queue = await channel.declare_queue(f"test.{routing_key}", durable=True)
    await queue.bind(await channel.get_exchange(EXCHANGE), routing_key)
    return queue


async def drain(queue: aio_pika.abc.AbstractQueue, count: int) -> list[aio_pika.IncomingMessage]:
    received: list[aio_pika.IncomingMessage] = []
    async with asyncio.timeout(30):
        while len(received) < count:
            message = await queue.get(no_ack=True, fail=False)
            if message is None:
                await asyncio.sleep(0.05)
                continue
            received.append(message)
    assert await queue.get(no_ack=True, fail=False) is None, "more messages than published"
    return received


async def test_a_batch_arrives_whole_in_order_with_the_contracts_properties(
    amqp_url: str, path: PublishPath
) -> None:
    """Three routing keys interleaved, one payload larger than the broker's frame size (split
    over several body frames), an empty one, priorities, a ttl and producer headers."""
    large = b"x" * 300_000  # frame_max is 131072 by default
    batch: list[models.Claimed] = []
    for n in range(300):
        plain = job(f"pub.k{n % 3}", {"n": n})
        batch.append(
            dataclasses.replace(
                plain,
                payload=large if n == 7 else b"" if n == 8 else plain.payload,
                priority=n % 10 if n % 2 else None,
                ttl_ms=600_000 if n == 9 else None,
                idempotency_key=f"key-{n}" if n % 5 == 0 else None,
            )
        )
    async with running(amqp_url, path) as publisher:
        connection = await aio_pika.connect(amqp_url)
        channel = await connection.channel()
        queues = [await bound_queue(channel, f"pub.k{k}") for k in range(3)]
        outcome = await publisher.publish_many(batch)
        assert (outcome.failed, outcome.nacked, outcome.unpublishable) == ([], [], [])
        assert [item.id for item in outcome.confirmed] == [item.id for item in batch]
        received = [message for queue in queues for message in await drain(queue, 100)]
        await connection.close()
    by_id = {message.message_id: message for message in received}
    assert len(by_id) == len(batch)
    for item in batch:
        message = by_id[str(item.id)]
        assert message.body == item.payload
        assert message.routing_key == item.routing_key
        assert message.content_type == contract.CONTENT_TYPE
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.priority == (item.priority or 0)
        assert (message.expiration is not None) == (item.ttl_ms is not None)
        headers = message.headers
        assert headers["tenant"] == "t1"
        assert headers[contract.HEADER_JOB_ID] == str(item.id)
        assert headers.get(contract.HEADER_IDEMPOTENCY_KEY) == item.idempotency_key
    # Each routing key's messages arrive in the order of the batch.
    for k, queue_messages in enumerate([received[0:100], received[100:200], received[200:300]]):
        expected = [str(item.id) for item in batch if item.routing_key == f"pub.k{k}"]
        assert [message.message_id for message in queue_messages] == expected


async def test_delivery_tags_stay_in_step_across_batches_and_single_publishes(
    amqp_url: str, path: PublishPath
) -> None:
    """A batch takes consecutive tags; a plain publish on the same channel afterwards is confirmed
    as itself (were the tags out of step, its confirm would resolve another's future or none)."""
    async with running(amqp_url, path) as publisher:
        connection = await aio_pika.connect(amqp_url)
        channel = await connection.channel()
        queue = await bound_queue(channel, "pub.tags")
        for size in (1, 50, 1, 200):
            outcome = await publisher.publish_many(
                [job("pub.tags", {"size": size}) for _ in range(size)]
            )
            assert (len(outcome.confirmed), outcome.failed) == (size, [])
        underlay = publisher._channel
        assert underlay is not None
        amqp = await underlay.get_underlay_channel()
        confirmation = await asyncio.wait_for(
            amqp.basic_publish(
                b"{}",
                exchange=EXCHANGE,
                routing_key="pub.tags",
                properties=aiormq.spec.Basic.Properties(message_id="plain"),
            ),
            10,
        )
        assert isinstance(confirmation, aiormq.spec.Basic.Ack)
        assert amqp.confirmations == {}  # every tag taken was confirmed, none left waiting
        received = await drain(queue, 253)
        await connection.close()
    assert received[-1].message_id == "plain"


@pytest.mark.parametrize("closed", ["publisher", "channel"])
async def test_a_batch_without_a_usable_channel_is_reported_unconfirmed(
    amqp_url: str, closed: str, path: PublishPath
) -> None:
    """No exception reaches the firing loop: every job comes back as not confirmed. A channel
    closed under the publisher (aiormq's ChannelInvalidStateError, no AMQPError) included."""
    async with running(amqp_url, path) as publisher:
        batch = [job("pub.closed", n) for n in range(5)]
        if closed == "publisher":
            await publisher.close()
        else:
            assert publisher._channel is not None
            await (await publisher._channel.get_underlay_channel()).close()
        assert await publisher.publish_many(batch) == Outcome(failed=batch)


async def test_refused_and_unencodable_jobs_are_told_apart_from_the_confirmed(
    amqp_url: str, path: PublishPath
) -> None:
    """A full queue that rejects publishes gets its message nacked; a routing key AMQP cannot
    carry is unpublishable (never sent); the rest of the batch is confirmed."""
    async with running(amqp_url, path) as publisher:
        connection = await aio_pika.connect(amqp_url)
        channel = await connection.channel()
        full = await channel.declare_queue(
            f"test.full.{path}",
            durable=True,
            arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
        )
        await full.bind(await channel.get_exchange(EXCHANGE), "pub.full")
        ordinary = [job("pub.fine", n) for n in range(10)]
        refused = job("pub.full", 1)
        unencodable = job("x" * 300, 2)
        outcome = await publisher.publish_many([*ordinary[:5], refused, unencodable, *ordinary[5:]])
        await full.delete(if_unused=False, if_empty=False)
        await connection.close()
    assert outcome.confirmed == ordinary
    assert outcome.nacked == [refused]
    assert outcome.failed == []
    assert [(item, "cannot be encoded" in reason) for item, reason in outcome.unpublishable] == [
        (unencodable, True)
    ]


async def test_auto_frames_batches_on_the_tested_aiormq(amqp_url: str) -> None:
    async with running(amqp_url, "auto") as publisher:
        outcome = await publisher.publish_many([job("pub.auto", n) for n in range(3)])
        registry = publisher._metrics.registry
    assert (publisher.path, publisher.fallback_reason) == ("framed", None)
    assert registry.get_sample_value("dispatcher_publish_framed") == 1
    assert len(outcome.confirmed) == 3


async def test_auto_falls_back_to_per_message_on_an_untested_aiormq_and_says_so_once(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(frames, "TESTED_AIORMQ", ((6, 0, 0), (6, 0, 0)))
    caplog.set_level(logging.WARNING, logger="dispatcher.amqp.publisher")
    async with running(amqp_url, "auto") as publisher:
        for size in (1, 20, 5):
            outcome = await publisher.publish_many([job("pub.fallback", n) for n in range(size)])
            assert (len(outcome.confirmed), outcome.failed) == (size, [])
        registry = publisher._metrics.registry
    assert publisher.path == "per_message"
    assert publisher.fallback_reason is not None
    assert "outside the range tested" in publisher.fallback_reason
    assert registry.get_sample_value("dispatcher_publish_framed") == 0
    warnings = [r for r in caplog.records if "one message at a time" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING


async def test_framed_required_on_an_untested_aiormq_stops_at_connect(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frames, "TESTED_AIORMQ", ((6, 0, 0), (6, 0, 0)))
    publisher = new_publisher(amqp_url, "framed")
    with pytest.raises(errors.FramedPublishUnsupported, match="outside the range tested"):
        await publisher.run()
    assert not publisher.is_ready()
    await publisher.close()
