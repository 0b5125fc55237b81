"""The publisher given several broker URLs: it connects to the first that answers, and when the
node it is on is killed it moves to another and keeps publishing; what was not confirmed is sent
again (at least once), so nothing is lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from consumers_sdk import broker_urls, contract
from devstack.collector import Collector
from devstack.jobs_out import job
from devstack.ports import reserve_port
from devstack.rabbitmq import RabbitServer
from devstack.rabbitmq_cluster import RabbitCluster
from dispatcher import metrics, models
from dispatcher.amqp.publisher import Publisher
from tests.support.waiting import eventually

NAME = "test-publisher"
BATCH = 20


def new_publisher(amqp_url: str) -> Publisher:
    return Publisher(
        amqp_url,
        exchange=contract.EXCHANGE,
        unroutable_exchange="dispatcher.unroutable",
        connection_name=NAME,
        timeout_s=10.0,
        metrics=metrics.Metrics(),
        now=time.time,
    )


@contextlib.asynccontextmanager
async def running(amqp_url: str) -> AsyncIterator[Publisher]:
    publisher = new_publisher(amqp_url)
    await asyncio.wait_for(publisher.run(), 60)
    try:
        yield publisher
    finally:
        await publisher.close()


async def test_the_publisher_connects_to_the_first_broker_url_that_answers(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    vhost = broker_urls.vhost(amqp_url)
    nobody = f"amqp://guest:guest@127.0.0.1:{reserve_port()}/{vhost}"  # no broker listens there
    collector = Collector(amqp_url)
    await collector.start()
    try:
        async with running(f"{nobody},{amqp_url}") as publisher:
            jobs = [job("failover.first", {"n": number}) for number in range(BATCH)]
            outcome = await publisher.publish_many(jobs)
            names = await asyncio.to_thread(rabbit_server.connection_names, vhost)
        missing = await collector.wait_for([str(one.id) for one in jobs], 30)
    finally:
        await collector.stop()
    assert len(outcome.confirmed) == BATCH
    assert NAME in names
    assert missing == set()


@pytest.mark.rabbitmq_version  # how a broker refuses publishes differs between releases
async def test_a_nack_gets_the_publisher_a_new_channel(
    amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RabbitMQ 3.10 can go on refusing every publish on a channel that first published to a
    quorum queue during its leader's election; any nack renews the channel."""
    async with running(amqp_url) as publisher:
        connection = await aio_pika.connect(amqp_url)
        try:
            channel = await connection.channel()
            # A queue that refuses every message: the broker nacks what is routed to it.
            full = await channel.declare_queue(
                f"test.full.{uuid.uuid4().hex[:8]}",
                durable=True,
                arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
            )
            await full.bind(contract.EXCHANGE, "failover.full")
        finally:
            await connection.close()
        with caplog.at_level(logging.INFO, logger="dispatcher.amqp.publisher"):
            refused = await publisher.publish_many([job("failover.full", {"n": 1})])
        after = await publisher.publish_many([job("failover.elsewhere", {"n": 2})])
    assert len(refused.nacked) == 1
    assert "new channel after a nack" in caplog.text
    assert len(after.confirmed) == 1


def node_of(cluster: RabbitCluster, vhost: str) -> RabbitServer | None:
    """The running node the publisher's connection is on."""
    for node in cluster.nodes:
        if node.is_running() and NAME in node.connection_names(vhost):
            return node
    return None


class Firing:
    """Publishes batches without pause, sending again what was not confirmed, as firing does."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self.accepted: dict[str, float] = {}  # id -> due (epoch seconds), for the ledger
        self.confirmed = 0
        self.failed_rounds = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        pending: list[models.Claimed] = []
        while not self._stop.is_set() or pending:
            if not self._stop.is_set():
                fresh = [job("failover.kill", {"n": len(self.accepted) + i}) for i in range(BATCH)]
                self.accepted.update({str(one.id): one.run_at.timestamp() for one in fresh})
                pending += fresh
            outcome = await self._publisher.publish_many(pending)
            self.confirmed += len(outcome.confirmed)
            pending = outcome.failed + outcome.nacked
            if pending:
                self.failed_rounds += 1
                await asyncio.sleep(0.2)  # the connection moves to another node meanwhile

    def stop(self) -> None:
        self._stop.set()


# On RabbitMQ 4.x the same kills happen in tests/faults/test_rabbitmq_cluster.py, through a
# dispatcher: this runs once, on 3.x.
@pytest.mark.faults
@pytest.mark.parametrize("victim", ["its node", "the queue's leader"])
async def test_the_publisher_keeps_publishing_when_a_node_is_killed_and_loses_nothing(
    rabbit_cluster: RabbitCluster, cluster_url: str, victim: str
) -> None:
    """Its node: the connection moves to another. The leader of the queue the jobs go to (the
    publisher on another node): refused publishes are sent again on a new channel."""
    vhost = broker_urls.vhost(cluster_url)
    urls = rabbit_cluster.urls(vhost)
    # Declared through node 1, which leads the queue on 3.x; its queue outlives any one node.
    collector = Collector(cluster_url, quorum=True)
    await collector.start()
    publisher_urls = cluster_url if victim == "its node" else ",".join(urls[1:] + urls[:1])
    try:
        async with running(publisher_urls) as publisher:
            firing = Firing(publisher)
            task = asyncio.create_task(firing.run(), name="test-firing")
            await eventually(lambda: firing.confirmed >= 500, 60)
            before = await asyncio.to_thread(node_of, rabbit_cluster, vhost)
            if victim == "its node":
                killed = before
            else:
                leader_of = rabbit_cluster.leader_of
                killed = await asyncio.to_thread(leader_of, collector.queue_name, vhost)
            assert killed is not None

            await asyncio.to_thread(rabbit_cluster.kill, killed)
            killed_at, confirmed_at_kill = time.monotonic(), firing.confirmed

            await eventually(lambda: firing.confirmed >= confirmed_at_kill + 500, 90)
            resumed_s = time.monotonic() - killed_at
            firing.stop()
            await asyncio.wait_for(task, 90)
            after = await asyncio.to_thread(node_of, rabbit_cluster, vhost)
        ledger = await collector.reckon(firing.accepted, deadline_s=90, quiet_s=1.5)
    finally:
        await collector.stop()
    print(
        f"\nkilled {killed.nodename} ({victim}) after {confirmed_at_kill} confirms; 500 more "
        f"{resumed_s:.1f}s after the kill, through {after.nodename if after else None}; "
        f"{firing.failed_rounds} rounds not wholly confirmed; {ledger}"
    )
    assert after is not None
    assert after is not killed
    assert ledger.lost == []
