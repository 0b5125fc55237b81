"""A consumer under a RabbitMQ user with exactly the permissions the docs give a consumer
group ("Consumer events: who may publish them"): it consumes, retries, dead-letters and reports
events, and cannot publish jobs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote, unquote, urlsplit

import aio_pika
import aiormq
import httpx
import pytest

from consumers_sdk import Consumer, Job, Reject, contract, topology
from devstack.rabbitmq import RabbitServer
from dispatcher.node import Node
from tests.integration.test_consumer import TIERS, fixed
from tests.support.consumers import running
from tests.support.nodes import client, running_node
from tests.support.queues import depth_reaches
from tests.support.waiting import job_when

# As in docs/concepts/job-life.md: configure, write, read.
# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version


CONFIGURE = r"^billing\."
WRITE = r"^(billing\..*|amq\.default|dispatcher\.events)$"
READ = r"^(billing\..*|dispatcher\.jobs)$"
PASSWORD = "billing-secret"


@pytest.fixture
def consumer_url(rabbit_server: RabbitServer, amqp_url: str) -> Iterator[str]:
    """The AMQP URL of a new user of the test's vhost with the docs' consumer permissions."""
    user = f"billing-{uuid.uuid4().hex[:8]}"
    vhost = unquote(urlsplit(amqp_url).path.lstrip("/"))
    quoted = quote(vhost, safe="")
    with httpx.Client(base_url=rabbit_server.mgmt_url, auth=("guest", "guest"), timeout=30) as http:
        http.put(f"/api/users/{user}", json={"password": PASSWORD, "tags": ""}).raise_for_status()
        http.put(
            f"/api/permissions/{quoted}/{user}",
            json={"configure": CONFIGURE, "write": WRITE, "read": READ},
        ).raise_for_status()
    yield f"amqp://{user}:{PASSWORD}@127.0.0.1:{rabbit_server.amqp_port}/{quoted}"
    with httpx.Client(base_url=rabbit_server.mgmt_url, auth=("guest", "guest"), timeout=30) as http:
        http.delete(f"/api/users/{user}")


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    """The dispatcher (as guest) declares the jobs and events exchanges a consumer may not."""
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, node_id="perms", shard_count=4
    ) as running_one:
        yield running_one


async def test_a_consumer_with_the_readmes_permissions_consumes_retries_dead_letters_and_reports(
    node: Node, consumer_url: str, amqp_url: str
) -> None:
    consumer = Consumer(consumer_url, group="billing", retry_tiers=TIERS, name="worker-1")
    tries: dict[int, int] = {}

    @consumer.handler("orders.charge", max_attempts=3, backoff=fixed(0.3))
    async def charge(job: Job) -> None:
        order = job.payload["order"]
        tries[order] = tries.get(order, 0) + 1
        if order == 2:
            raise Reject("card refused")
        if tries[order] == 1:
            raise RuntimeError("gateway timeout")

    async with running(consumer), client(node) as http:
        retried, refused = [
            (await http.post("/v1/jobs", json={"routing_key": "orders.charge", "payload": p}))
            .raise_for_status()
            .json()["id"]
            for p in ({"order": 1}, {"order": 2})
        ]
        done = await job_when(http, retried, "succeeded")
        dead = await job_when(http, refused, "dead")
        await depth_reaches(amqp_url, topology.dead_queue("billing.orders.charge"), 1, 20)
    steps = [(step["event"], step["attempt"], step["ignored"]) for step in done["history"][2:]]
    assert steps == [
        ("started", 1, None),
        ("failed", 1, None),
        ("started", 2, None),
        ("succeeded", 2, None),
    ]
    assert dead["last_error"] == "Reject: card refused"
    assert tries == {1: 2, 2: 1}


async def test_a_consumer_user_cannot_publish_jobs(node: Node, consumer_url: str) -> None:
    connection = await aio_pika.connect(consumer_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        jobs = await channel.get_exchange(contract.EXCHANGE, ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await jobs.publish(
                aio_pika.Message(b"{}", message_id=str(uuid.uuid4())), routing_key="orders.charge"
            )
    finally:
        await connection.close()
