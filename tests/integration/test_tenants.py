"""Tenants on one broker: each consumer user has exactly the permissions the docs give a tenant
(docs/concepts/job-life.md, "Tenants on one broker"), and the dispatcher is told which user may
report on which routing keys (DISPATCHER_EVENT_USERS). A tenant's user can neither bind another
tenant's keys nor read its queues, and its forged events change nothing; its own jobs work."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from urllib.parse import quote, unquote, urlsplit

import aio_pika
import aiormq
import httpx
import pytest

from consumers_sdk import Consumer, Job, contract, reporter
from devstack import tenants
from devstack.rabbitmq import RabbitServer
from dispatcher.node import Node
from tests.integration.test_consumer import TIERS
from tests.support import dispatched
from tests.support.consumers import running
from tests.support.nodes import client, running_node
from tests.support.waiting import eventually, ignored_steps, job_when

# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version

PASSWORD = "tenant-secret"
SUFFIX = uuid.uuid4().hex[:8]  # users live beside the test's vhost: one name a run
BILLING = f"billing-consumer-{SUFFIX}"
PAYMENTS = f"payments-consumer-{SUFFIX}"


@pytest.fixture
def tenant_urls(rabbit_server: RabbitServer, amqp_url: str) -> Iterator[Callable[[str], str]]:
    """The AMQP URL of the billing and payments users, made with the documented permissions on
    the test's vhost (the management API's equivalents of the docs' rabbitmqctl lines)."""
    vhost = quote(unquote(urlsplit(amqp_url).path.lstrip("/")), safe="")
    users = {"billing": BILLING, "payments": PAYMENTS}
    with httpx.Client(base_url=rabbit_server.mgmt_url, auth=("guest", "guest"), timeout=30) as http:
        for tenant, user in users.items():
            made = {"password": PASSWORD, "tags": ""}
            http.put(f"/api/users/{user}", json=made).raise_for_status()
            granted = tenants.permissions(tenant)  # the docs' commands, as make run applies them
            http.put(
                f"/api/permissions/{vhost}/{user}", json=granted.pop("permissions")
            ).raise_for_status()
            for exchange, topic in granted.items():
                http.put(
                    f"/api/topic-permissions/{vhost}/{user}", json={"exchange": exchange, **topic}
                ).raise_for_status()
    yield (
        lambda tenant: (
            f"amqp://{users[tenant]}:{PASSWORD}@127.0.0.1:{rabbit_server.amqp_port}/{vhost}"
        )
    )
    with httpx.Client(base_url=rabbit_server.mgmt_url, auth=("guest", "guest"), timeout=30) as http:
        for user in users.values():
            http.delete(f"/api/users/{user}")


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    """The dispatcher (as guest) declares the exchanges, and knows who may report on what."""
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="tenants",
        shard_count=4,
        event_users=f"{BILLING}=billing.,{PAYMENTS}=payments.",
    ) as running_one:
        yield running_one


async def refused(attempt: Callable[[aio_pika.abc.AbstractChannel], object], url: str) -> str:
    """What the broker answers ATTEMPT(channel) with on a connection as URL (it must refuse)."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        with pytest.raises(aiormq.exceptions.ChannelClosed) as closed:
            await attempt(channel)  # type: ignore[misc]
        return str(closed.value)
    finally:
        await connection.close()


async def test_a_tenants_user_cannot_bind_another_prefix_nor_read_its_queues_nor_its_events(
    node: Node, tenant_urls: Callable[[str], str]
) -> None:
    billing = tenant_urls("billing")

    async def bind(key: str) -> Callable[[aio_pika.abc.AbstractChannel], object]:
        async def attempt(channel: aio_pika.abc.AbstractChannel) -> None:
            spy = await channel.declare_queue("billing.spy", durable=True)
            await spy.bind(contract.EXCHANGE, key)

        return attempt

    # Every tenant's jobs, another tenant's, any first word: refused by the topic permission.
    for key in ("#", "payments.#", "*.charge", "payments.charge"):
        answer = await refused(await bind(key), billing)
        assert "ACCESS_REFUSED" in answer, key
        assert "topic" in answer, key
    # Its own keys bind (the SDK's handlers do so).
    connection = await aio_pika.connect(billing)
    try:
        channel = await connection.channel()
        own = await channel.declare_queue("billing.spy", durable=True)
        await own.bind(contract.EXCHANGE, "billing.#")
    finally:
        await connection.close()

    async def consume_payments_queue(channel: aio_pika.abc.AbstractChannel) -> None:
        queue = await channel.get_queue("payments.payments.charge", ensure=False)
        await queue.consume(ignore)

    async def publish_a_payments_event(channel: aio_pika.abc.AbstractChannel) -> None:
        events = await channel.get_exchange(contract.EVENTS_EXCHANGE, ensure=False)
        await events.publish(aio_pika.Message(b"[]"), routing_key="payments.charge")

    assert "ACCESS_REFUSED" in await refused(consume_payments_queue, billing)
    assert "ACCESS_REFUSED" in await refused(publish_a_payments_event, billing)


async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    await message.ack()


async def forge(
    url: str, job_id: str, dispatch_round: str, *, exchange: str, key: str, user_id: str | None
) -> None:
    """A dead event about JOB_ID published as URL's user, naming USER_ID (or none) as its
    publisher."""
    forged = dispatched.event(
        job_id, "dead", dispatch_round=dispatch_round, routing_key="payments.charge"
    )
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        target = (
            await channel.get_exchange(exchange, ensure=False)
            if exchange
            else channel.default_exchange
        )
        await target.publish(
            aio_pika.Message(contract.encode_events([forged]), user_id=user_id), routing_key=key
        )
    finally:
        await connection.close()


async def test_another_tenants_forged_events_are_ignored_and_each_tenants_own_jobs_work(
    node: Node, tenant_urls: Callable[[str], str], database_url: str
) -> None:
    billing, payments = tenant_urls("billing"), tenant_urls("payments")
    started, release = asyncio.Event(), asyncio.Event()
    billing_consumer = Consumer(billing, group="billing", retry_tiers=TIERS, name="b-1")
    payments_consumer = Consumer(payments, group="payments", retry_tiers=TIERS, name="p-1")

    @billing_consumer.handler("billing.charge")
    async def charge(job: Job) -> None:
        return None

    @payments_consumer.handler("payments.charge")
    async def pay(job: Job) -> None:
        started.set()
        await release.wait()

    async with running(billing_consumer), running(payments_consumer), client(node) as http:
        own = await submit(http, "billing.charge")
        done = await job_when(http, own, "succeeded")
        assert [(s["event"], s["ignored"]) for s in done["history"][2:]] == [
            ("started", None),
            ("succeeded", None),
        ]

        theirs = await submit(http, "payments.charge")
        await eventually(started.is_set, 30)
        await job_when(http, theirs, "dispatched")
        # The worst case: the forger knows the round of the other tenant's delivery.
        known = str(await dispatched.dispatch_round(database_url, theirs))

        # Through the SDK: its user may not publish under another tenant's routing key.
        forger = reporter.EventReporter(billing, group="billing", consumer="mallory")
        forger.open()
        forger.report(
            job_id=theirs,
            routing_key="payments.charge",
            attempt=1,
            outcome="dead",
            dispatch_round=known,
        )
        await forger.close(2)
        assert forger.published == 0
        # Under its own key (allowed), or straight into the queue by the default exchange
        # (which topic permissions do not cover): recorded, ignored.
        events = contract.EVENTS_EXCHANGE
        await forge(billing, theirs, known, exchange=events, key="billing.x", user_id=BILLING)
        await forge(billing, theirs, known, exchange="", key=contract.EVENTS_QUEUE, user_id=None)
        # Naming the other tenant's user: RabbitMQ refuses the message.
        with pytest.raises(aiormq.exceptions.ChannelClosed, match="user_id"):
            await forge(billing, theirs, known, exchange=events, key="billing.x", user_id=PAYMENTS)
        assert sorted(await ignored_steps(http, theirs, 2)) == [
            ("dead", "no_user"),
            ("dead", "publisher"),
        ]
        assert await dispatched.state_of(database_url, theirs) == ("dispatched", None)
        metrics = (await http.get("/metrics")).text
        assert 'dispatcher_events_ignored_total{reason="publisher"} 1.0' in metrics

        release.set()
        finished = await job_when(http, theirs, "succeeded")
    assert finished["last_error"] is None


async def submit(http: httpx.AsyncClient, routing_key: str) -> str:
    answer = await http.post("/v1/jobs", json={"routing_key": routing_key, "payload": 1})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])
