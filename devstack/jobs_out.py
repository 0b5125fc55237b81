"""Publish jobs exactly as the dispatcher would (its own message builder), for consumer tests."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import aio_pika
import orjson
from aio_pika.abc import FieldValue

from consumers_sdk import contract, ids
from dispatcher import models
from dispatcher.amqp.publisher import message_properties

IDS = ids.JobIds()


def job(routing_key: str, payload: Any) -> models.Claimed:
    return models.Claimed(
        id=IDS.next(),
        shard=0,
        routing_key=routing_key,
        payload=orjson.dumps(payload),
        run_at=datetime.now(UTC),
        idempotency_key=None,
        headers={"tenant": "t1"},
        priority=None,
        ttl_ms=None,
        dispatch_round=uuid.uuid4(),
    )


async def publish(amqp_url: str, jobs: Sequence[models.Claimed]) -> list[str]:
    """Publish with confirms to the jobs exchange; returns the job ids."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(
            contract.EXCHANGE,
            aio_pika.ExchangeType.TOPIC,
            durable=True,
            arguments=dict[str, FieldValue](contract.exchange_arguments()),
        )
        amqp = await channel.get_underlay_channel()
        for item in jobs:
            await amqp.basic_publish(
                item.payload,
                exchange=exchange.name,
                routing_key=item.routing_key,
                properties=message_properties(item, datetime.now(UTC)),
            )
    finally:
        await connection.close()
    return [str(item.id) for item in jobs]


async def publish_raw(amqp_url: str, routing_key: str, message: aio_pika.Message) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(contract.EXCHANGE)
        await exchange.publish(message, routing_key)
    finally:
        await connection.close()


def new_id() -> str:
    return str(uuid.uuid4())
