"""The SDK consumer renews its publishing channel after a nacked move. In the serial pass: it
swaps a queue under a job redelivered in a loop, which a loaded machine's timing skews."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aio_pika
import pytest

from consumers_sdk import Consumer, Job, topology
from devstack.jobs_out import job, publish
from tests.support.consumers import running
from tests.support.waiting import eventually

pytestmark = pytest.mark.serial

WORK = "billing.orders.expire"


def fixed(seconds: float) -> Callable[[int], float]:
    return lambda _attempt: seconds


async def test_a_refused_move_gets_the_consumer_a_new_channel_and_the_job_retries(
    amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RabbitMQ 3.10 can go on nacking every publish on a channel that first published to a
    quorum queue during its leader's election: a nacked move renews the channel, and the job,
    handed back meanwhile, moves once the queue takes messages again."""
    consumer = Consumer(amqp_url, group="billing", retry_tiers=(0.3,))
    attempts: list[int] = []
    restored = asyncio.Event()

    @consumer.handler("orders.expire", max_attempts=5, backoff=fixed(0.3))
    async def expire(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            if len(attempts) > 1:
                # Handed back after the refused move: held until the queue takes copies again,
                # so the quorum queue's delivery limit is not spent while the test swaps it.
                await restored.wait()
            raise RuntimeError("fails once")

    wait = topology.wait_queue(WORK, 0.3)
    async with running(consumer):
        connection = await aio_pika.connect(amqp_url)
        try:
            channel = await connection.channel()
            arguments = dict(topology.wait_arguments(WORK, 0.3, "quorum"))  # as the SDK's
            # A full queue that rejects publishes: the broker nacks every copy moved to it
            # (classic: a quorum queue checks its length after the fact and takes the first).
            await channel.queue_delete(wait)
            refusing: topology.Arguments = {"x-max-length": 0, "x-overflow": "reject-publish"}
            full = {**topology.wait_arguments(WORK, 0.3, "classic"), **refusing}
            await channel.declare_queue(wait, durable=True, arguments=full)
            with caplog.at_level(logging.INFO, logger="consumers_sdk.delivery"):
                await publish(amqp_url, [job("orders.expire", 1)])
                await eventually(lambda: "new channel after a nack" in caplog.text, 30)
                await channel.queue_delete(wait)
                await channel.declare_queue(wait, durable=True, arguments=arguments)
                restored.set()
                await eventually(lambda: 2 in attempts, 60)
        finally:
            await connection.close()
    assert set(attempts) == {1, 2}, "it went through the wait queue once the queue took it"
    assert attempts[-1] == 2
    assert "could not move job" in caplog.text
