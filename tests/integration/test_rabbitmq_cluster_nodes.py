"""A three-node RabbitMQ cluster on one machine (``devstack.rabbitmq_cluster``): a quorum queue
outlives the node that leads it, and a killed node restarts and rejoins."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractConnection

from consumers_sdk import broker_urls
from devstack.rabbitmq_cluster import RabbitCluster
from tests.support.waiting import until

# Kills real nodes. On RabbitMQ 4.x the same happens in tests/faults/test_rabbitmq_cluster.py,
# through a dispatcher and the SDK: this file runs once, on 3.x.
pytestmark = pytest.mark.faults

MESSAGES = 100
CONFIRM_S = 60.0  # a new leader is elected within seconds; generous on a loaded machine


async def publish_confirmed(connection: AbstractConnection, queue: str, bodies: list[str]) -> int:
    """Publish each body to QUEUE until the broker confirms it, sending again what it refused,
    on a new channel (as the dispatcher does: RabbitMQ 3.10 goes on refusing every publish on a
    channel whose first publish to the queue came while its leader was being elected); returns
    how many publishes were refused."""
    refused = 0
    pending = list(bodies)
    async with asyncio.timeout(CONFIRM_S):
        while pending:
            channel = await connection.channel(publisher_confirms=True)
            results = await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            body.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        ),
                        routing_key=queue,
                    )
                    for body in pending
                ),
                return_exceptions=True,
            )
            await channel.close()
            if failure := next(
                (
                    result
                    for result in results
                    if isinstance(result, BaseException)
                    and not isinstance(result, aiormq.exceptions.DeliveryError)
                ),
                None,
            ):
                raise failure
            nacked = [
                body
                for body, result in zip(pending, results, strict=True)
                if isinstance(result, aiormq.exceptions.DeliveryError)
            ]
            refused += len(nacked)
            pending = nacked
    return refused


async def consume_all(connection: AbstractConnection, queue: str, count: int) -> list[str]:
    """Ack COUNT messages from QUEUE; their bodies."""
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=count)
    bodies: list[str] = []
    got = asyncio.Event()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        bodies.append(message.body.decode())
        await message.ack()
        if len(bodies) >= count:
            got.set()

    declared = await channel.declare_queue(queue, passive=True)
    await declared.consume(on_message)
    async with asyncio.timeout(CONFIRM_S):
        await got.wait()
    await channel.close()
    return bodies


async def test_a_quorum_queue_takes_and_gives_messages_after_its_leader_is_killed(
    rabbit_cluster: RabbitCluster, cluster_url: str
) -> None:
    vhost = broker_urls.vhost(cluster_url)
    queue = f"ha.{uuid.uuid4().hex[:8]}"
    first = await aio_pika.connect(rabbit_cluster.seed.url(vhost))
    try:
        channel = await first.channel()
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        before = [f"before-{number}" for number in range(MESSAGES)]
        await publish_confirmed(first, queue, before)
    finally:
        await first.close()
    leader = await asyncio.to_thread(rabbit_cluster.leader_of, queue, vhost)

    await asyncio.to_thread(rabbit_cluster.kill, leader)

    survivor = next(node for node in rabbit_cluster.nodes if node is not leader)
    connection = await aio_pika.connect(survivor.url(vhost))
    try:
        after = [f"after-{number}" for number in range(MESSAGES)]
        refused = await publish_confirmed(connection, queue, after)  # by the new leader
        consumed = await consume_all(connection, queue, 2 * MESSAGES)
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    new_leader = await asyncio.to_thread(rabbit_cluster.leader_of, queue, vhost)
    print(f"\nleader {leader.nodename} killed; {refused} publishes refused until a new leader")
    assert new_leader is not leader
    assert sorted(consumed) == sorted(before + after)


async def test_a_killed_node_restarts_and_rejoins_the_cluster(
    rabbit_cluster: RabbitCluster, cluster_url: str
) -> None:
    everyone = {node.nodename for node in rabbit_cluster.nodes}
    victim = rabbit_cluster.nodes[-1]

    await asyncio.to_thread(rabbit_cluster.kill, victim)

    async def seen_down() -> bool:
        running = await asyncio.to_thread(rabbit_cluster.running_nodes, rabbit_cluster.seed)
        return running == everyone - {victim.nodename}

    await until(seen_down, 60)  # the others notice the loss
    await asyncio.to_thread(rabbit_cluster.restart, victim)

    for node in rabbit_cluster.nodes:
        assert await asyncio.to_thread(rabbit_cluster.running_nodes, node) == everyone
