"""What happens past each queue's delivery limit, on the broker the suite runs (3.x, and 4.x in
`make test`'s second pass): dead jobs and events are never dropped by a broker default, refused
events are dead-lettered and counted, queues of an earlier release are kept with a warning and
mended by `dispatcher broker apply-policies`, and any other difference is named."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime

import aio_pika
import asyncpg
import httpx
import pytest

from consumers_sdk import contract, dlq, management, policies, topology
from consumers_sdk.errors import DlqError, TopologyMismatch
from devstack.rabbitmq import RabbitServer
from dispatcher.node import Node
from tests.support.nodes import client, running_node
from tests.support.queues import consumers_reach, depth_reaches, wait_for_queue
from tests.support.stored_events import STORED_EVENTS
from tests.support.waiting import until

# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version


WORK = topology.work_queue("billing", "orders.expire")
DEAD = topology.dead_queue(WORK)
LOOKS = 30  # past RabbitMQ 4's default limit of 20


def management_url(rabbit: RabbitServer) -> str:
    return rabbit.mgmt_url.replace("http://", "http://guest:guest@")


def handler_topology(major: int) -> list[topology.QueueSpec]:
    return topology.handler_queues(
        work=WORK, routing_key="orders.expire", tiers=[1.0], queue_type="quorum", major=major
    )


async def put(amqp_url: str, queue: str, bodies: list[bytes], *, ids: list[str]) -> None:
    """Publish straight into a queue (the default exchange), with confirms; a queue that is not
    there fails the publish (returned), rather than dropping the message unseen."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        for body, message_id in zip(bodies, ids, strict=True):
            await channel.default_exchange.publish(
                aio_pika.Message(body, message_id=message_id, delivery_mode=2), routing_key=queue
            )
    finally:
        await connection.close()


async def look_through_the_management_ui(rabbit: RabbitServer, amqp_url: str, queue: str) -> int:
    """The UI's "Get messages" with "Nack message requeue true": each look is a redelivery."""
    async with management.connect(management_url(rabbit)) as http:
        path = f"/api/queues/{management.vhost_path(amqp_url)}/{queue}/get"
        body = {"count": 10, "ackmode": "ack_requeue_true", "encoding": "auto"}
        return len((await management.request(http, "POST", path, json=body)).json())


async def hand_back(amqp_url: str, queue: str, times: int) -> None:
    """Take every message and nack it back, ``times`` rounds: each round is a redelivery."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        for _ in range(times):
            taken = []
            while (got := await declared.get(fail=False)) is not None:
                taken.append(got)
            for got in taken:
                await got.nack(requeue=True)
    finally:
        await connection.close()


async def listed_dead(rabbit: RabbitServer, amqp_url: str) -> dict[str, int | None]:
    return {q.name: q.messages for q in await dlq.list_dead(amqp_url, management_url(rabbit))}


async def test_dead_jobs_survive_any_number_of_looks_and_passed_over_requeues(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    await topology.declare(amqp_url, handler_topology)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    await put(amqp_url, DEAD, [b'{"order": 1}'] * 3, ids=ids)
    for _ in range(LOOKS):
        # A quorum queue takes back what was handed back a moment after the nack is sent.
        await depth_reaches(amqp_url, DEAD, 3, 10)
        assert await look_through_the_management_ui(rabbit_server, amqp_url, DEAD) == 3
    for _ in range(LOOKS):  # each run hands back every dead job it passes over
        await depth_reaches(amqp_url, DEAD, 3, 10)
        with pytest.raises(DlqError, match="no job"):
            await dlq.requeue_job(amqp_url, DEAD, str(uuid.uuid4()))
    await depth_reaches(amqp_url, DEAD, 3, 10)
    # `dispatcher dlq list` counts them even where the management API gives no count (4.x).
    await until(lambda: listed(rabbit_server, amqp_url), 20)


async def listed(rabbit: RabbitServer, amqp_url: str) -> bool:
    return (await listed_dead(rabbit, amqp_url)).get(DEAD) == 3


async def stored_job(database_url: str, amqp_url: str) -> str:
    async with (
        running_node(database_url=database_url, amqp_url=amqp_url, shard_count=2) as node,
        client(node) as http,
    ):
        body = {"routing_key": "orders.expire", "payload": {}, "delay_ms": 600_000}
        response = await http.post("/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


def event_for(job_id: str) -> contract.JobEvent:
    return contract.JobEvent(
        event_id=str(uuid.uuid4()),
        job_id=job_id,
        routing_key="orders.expire",
        group="billing",
        consumer="worker-1",
        attempt=1,
        outcome="started",
        error=None,
        at=datetime.now(UTC),
    )


async def recorded(database_url: str, event_id: str) -> bool:
    connection = await asyncpg.connect(database_url)
    try:
        found = await connection.fetchval(
            f"SELECT count(*) FROM {STORED_EVENTS} WHERE event_id = $1", uuid.UUID(event_id)
        )
    finally:
        await connection.close()
    return bool(found)


async def test_an_event_handed_back_past_the_broker_default_is_still_recorded(
    database_url: str, amqp_url: str
) -> None:
    job_id = await stored_job(database_url, amqp_url)
    event = event_for(job_id)
    await put(amqp_url, contract.EVENTS_QUEUE, [contract.encode_event(event)], ids=[event.event_id])
    await hand_back(amqp_url, contract.EVENTS_QUEUE, LOOKS)
    await depth_reaches(amqp_url, contract.EVENTS_QUEUE, 1, 10)
    async with running_node(database_url=database_url, amqp_url=amqp_url, shard_count=2):
        await until(lambda: recorded(database_url, event.event_id), 20)


async def test_a_refused_event_is_dead_lettered_counted_and_can_be_requeued(
    database_url: str, amqp_url: str
) -> None:
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, shard_count=2, stats_interval_s=0.2
    ) as node:
        # The node is started once its publishers are; its events consumer declares the queue
        # on its own connection: a message put before that would be dropped as unroutable.
        await wait_for_queue(amqp_url, contract.EVENTS_QUEUE)
        await consumers_reach(amqp_url, contract.EVENTS_QUEUE, 1, 30)
        await put(amqp_url, contract.EVENTS_QUEUE, [b"not an event"], ids=["x"])
        await depth_reaches(amqp_url, topology.EVENTS_DEAD_QUEUE, 1, 20)
        assert refused_total(node) == 1
        await until(lambda: counted_dead(node), 10)
        # Once the cause is fixed, dlq requeue sends them back to the events queue.
        assert (await dlq.requeue(amqp_url, topology.EVENTS_DEAD_QUEUE)).moved == 1
        await until(lambda: no_longer_refused(node, 2), 20)  # refused again: same bytes
        await depth_reaches(amqp_url, topology.EVENTS_DEAD_QUEUE, 1, 20)


async def test_a_message_of_events_is_recorded_whole_and_one_with_a_broken_event_refused_whole(
    database_url: str, amqp_url: str
) -> None:
    job_id = await stored_job(database_url, amqp_url)
    good = [event_for(job_id) for _ in range(3)]
    spoilt = [event_for(job_id) for _ in range(2)]
    broken = json.loads(contract.encode_events(spoilt))
    broken[1]["outcome"] = "exploded"
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, shard_count=2, stats_interval_s=0.2
    ) as node:
        await wait_for_queue(amqp_url, contract.EVENTS_QUEUE)
        await consumers_reach(amqp_url, contract.EVENTS_QUEUE, 1, 30)
        bodies = [contract.encode_events(good), json.dumps(broken).encode()]
        await put(amqp_url, contract.EVENTS_QUEUE, bodies, ids=["good", "broken"])
        await depth_reaches(amqp_url, topology.EVENTS_DEAD_QUEUE, 1, 20)
        for event in good:
            await until(lambda event=event: recorded(database_url, event.event_id), 20)
        assert refused_total(node) == 1
    assert not await recorded(database_url, spoilt[0].event_id)  # its message was refused whole


def refused_total(node: Node) -> float:
    return node.core.metrics.registry.get_sample_value("dispatcher_events_refused_total") or 0.0


async def no_longer_refused(node: Node, count: int) -> bool:
    return refused_total(node) == count


async def counted_dead(node: Node) -> bool:
    return await node.messaging.events.count_dead_letters() == 1


async def declare_as_an_earlier_release(amqp_url: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        for name in (DEAD, contract.EVENTS_QUEUE):
            await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        await connection.close()


def policies_of(rabbit: RabbitServer, amqp_url: str) -> dict[str, str]:
    """Each queue's policy, from the node (the management API shows none without metrics)."""
    listed = rabbit.ctl(
        "list_queues",
        "-p",
        management.vhost(amqp_url),
        "name",
        "policy",
        "-q",
        "--no-table-headers",
    )
    rows = (line.split("\t") for line in listed.splitlines() if line.strip())
    return {row[0]: (row[1] if len(row) > 1 else "") for row in rows}


async def test_queues_of_an_earlier_release_are_kept_with_a_warning_and_mended_by_the_policies(
    amqp_url: str, rabbit_server: RabbitServer, caplog: pytest.LogCaptureFixture
) -> None:
    await declare_as_an_earlier_release(amqp_url)
    caplog.set_level(logging.WARNING, logger="consumers_sdk.topology")
    await topology.declare(amqp_url, topology.events_queues)
    if rabbit_server.major >= 4:
        await topology.declare(amqp_url, handler_topology)
        assert f"queue {DEAD!r} was declared by an earlier release" in caplog.text
    assert f"queue {contract.EVENTS_QUEUE!r} was declared by an earlier release" in caplog.text
    assert topology.APPLY_POLICIES in caplog.text

    version, applied = await policies.apply(amqp_url, management_url(rabbit_server))
    assert topology.major_of(version) == rabbit_server.major
    expected = {"dispatcher-events"} | (
        {"dispatcher-dead-letter-queues"} if rabbit_server.major >= 4 else set()
    )
    assert {policy.name for policy in applied} == expected
    await policies.apply(amqp_url, management_url(rabbit_server))  # idempotent
    now = policies_of(rabbit_server, amqp_url)
    assert now[contract.EVENTS_QUEUE] == "dispatcher-events"
    if rabbit_server.major >= 4:
        assert now[DEAD] == now[topology.EVENTS_DEAD_QUEUE] == "dispatcher-dead-letter-queues"
        # The mended dead queue now survives what dropped its jobs before.
        await put(amqp_url, DEAD, [b"{}"], ids=[str(uuid.uuid4())])
        for _ in range(LOOKS):
            assert await look_through_the_management_ui(rabbit_server, amqp_url, DEAD) == 1


async def test_a_queue_declared_otherwise_is_named_in_the_error(amqp_url: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        await (await connection.channel()).declare_queue(WORK, durable=True)  # classic
    finally:
        await connection.close()
    with pytest.raises(TopologyMismatch) as refused:
        await topology.declare(amqp_url, handler_topology)
    assert refused.value.queue == WORK
    assert "x-delivery-limit" in str(refused.value.declared)


async def test_a_dry_run_lists_the_policies_and_writes_nothing(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    _, listed = await policies.apply(amqp_url, management_url(rabbit_server), dry_run=True)
    assert listed
    async with httpx.AsyncClient(base_url=rabbit_server.mgmt_url, auth=("guest", "guest")) as m:
        written = await m.get(f"/api/policies/{management.vhost_path(amqp_url)}")
    assert written.json() == []
