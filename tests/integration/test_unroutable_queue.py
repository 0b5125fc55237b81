"""The queue of unroutable jobs is a quorum queue (it must outlive a node of a cluster); one an
earlier release declared classic is kept as it stands, with a warning, and publishing goes on."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aio_pika
import pytest

from consumers_sdk import broker_urls, contract
from devstack.jobs_out import job
from devstack.rabbitmq import RabbitServer
from dispatcher import metrics
from dispatcher.amqp.publisher import Publisher

PARKED = "dispatcher.unroutable"


def new_publisher(amqp_url: str) -> Publisher:
    return Publisher(
        amqp_url,
        exchange=contract.EXCHANGE,
        unroutable_exchange=PARKED,
        connection_name="test-publisher",
        timeout_s=10.0,
        metrics=metrics.Metrics(),
        now=time.time,
    )


def queue_types(server: RabbitServer, vhost: str) -> dict[str, str]:
    listed = json.loads(
        server.ctl("list_queues", "-p", vhost, "name", "type", "--formatter", "json") or "[]"
    )
    return {str(entry["name"]): str(entry["type"]) for entry in listed}


async def parked_count(amqp_url: str) -> int:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(PARKED, passive=True)
        return queue.declaration_result.message_count or 0
    finally:
        await connection.close()


async def park_one(amqp_url: str) -> int:
    """Run a publisher, publish one job no queue is bound for; how many were confirmed."""
    publisher = new_publisher(amqp_url)
    await asyncio.wait_for(publisher.run(), 60)
    try:
        outcome = await publisher.publish_many([job("nobody.listens", {"n": 1})])
    finally:
        await publisher.close()
    return len(outcome.confirmed)


async def test_the_unroutable_queue_is_declared_quorum(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    confirmed = await park_one(amqp_url)
    types = await asyncio.to_thread(queue_types, rabbit_server, broker_urls.vhost(amqp_url))
    assert types[PARKED] == "quorum"
    assert confirmed == 1
    assert await parked_count(amqp_url) == 1


async def test_a_classic_unroutable_queue_from_an_earlier_release_is_kept_with_a_warning(
    amqp_url: str, rabbit_server: RabbitServer, caplog: pytest.LogCaptureFixture
) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(PARKED, durable=True)  # what releases before declared
    finally:
        await connection.close()
    with caplog.at_level(logging.WARNING, logger="consumers_sdk.topology"):
        confirmed = await park_one(amqp_url)
    types = await asyncio.to_thread(queue_types, rabbit_server, broker_urls.vhost(amqp_url))
    assert types[PARKED] == "classic"
    assert "upgrade notes" in caplog.text
    assert confirmed == 1
    assert await parked_count(amqp_url) == 1
