"""Job events: the SDK reports each attempt's outcome to the events exchange without ever holding
up a handler, and the dispatcher's store records each event once."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from datetime import UTC, datetime
from urllib.parse import quote, unquote, urlsplit

import aio_pika
import asyncpg
import httpx
import pytest

from consumers_sdk import Consumer, Job, contract, reporter, topology
from devstack.jobs_out import job, publish
from devstack.rabbitmq import RabbitServer
from dispatcher.store.db import Database
from dispatcher.store.history import HistoryStore
from tests.integration.test_consumer import TIERS, WORK, depth_reaches, fixed, queue_depth, running
from tests.support import dispatched
from tests.support.nodes import client, running_node
from tests.support.queues import consumers_reach
from tests.support.waiting import eventually

# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version


async def drain_events(amqp_url: str) -> list[contract.JobEvent]:
    """Every event waiting in the dispatchers' queue (taken off it)."""
    return [event for message in await drain_event_messages(amqp_url) for event in message]


async def drain_event_messages(amqp_url: str) -> list[list[contract.JobEvent]]:
    """Every message waiting in the dispatchers' queue, as the events each holds (taken off it)."""
    await topology.declare(amqp_url, topology.events_queues)
    connection = await aio_pika.connect(amqp_url)
    messages = []
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(contract.EVENTS_QUEUE, passive=True)
        while (message := await queue.get(fail=False)) is not None:
            messages.append(contract.decode_events(message.body))
            await message.ack()
    finally:
        await connection.close()
    return messages


def set_write(rabbit: RabbitServer, amqp_url: str, write: str) -> None:
    vhost = quote(unquote(urlsplit(amqp_url).path.lstrip("/")), safe="")
    with httpx.Client(base_url=rabbit.mgmt_url, auth=("guest", "guest"), timeout=30) as http:
        http.put(
            f"/api/permissions/{vhost}/guest",
            json={"configure": ".*", "write": write, "read": ".*"},
        ).raise_for_status()


async def test_the_sdk_reports_started_failed_succeeded_and_dead_with_attempts_and_errors(
    amqp_url: str,
) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS, name="worker-1")
    tries: dict[int, int] = {}

    @consumer.handler("orders.expire", max_attempts=2, backoff=fixed(0.3))
    async def expire(job: Job) -> None:
        order = job.payload["order"]
        tries[order] = tries.get(order, 0) + 1
        if order == 2 or tries[order] == 1:
            raise ValueError(f"boom {order}")

    async with running(consumer):
        [ok, bad] = await publish(
            amqp_url, [job("orders.expire", {"order": 1}), job("orders.expire", {"order": 2})]
        )
        await eventually(lambda: tries.get(1) == 2 and tries.get(2) == 2, 20)
        await depth_reaches(amqp_url, topology.dead_queue(WORK), 1, 10)
    assert consumer.events is not None
    assert consumer.events.pending == 0  # flushed at stop
    events = await drain_events(amqp_url)
    steps = {
        job_id: [
            (e.attempt, e.outcome) for e in sorted(events, key=lambda e: e.at) if e.job_id == job_id
        ]
        for job_id in (ok, bad)
    }
    assert steps[ok] == [(1, "started"), (1, "failed"), (2, "started"), (2, "succeeded")]
    assert steps[bad] == [(1, "started"), (1, "failed"), (2, "started"), (2, "dead")]
    dead = next(e for e in events if e.outcome == "dead")
    assert dead.error == "ValueError: boom 2"
    assert (dead.group, dead.consumer, dead.routing_key) == ("billing", "worker-1", "orders.expire")
    assert len({e.event_id for e in events}) == len(events) == 8


async def test_a_refusing_broker_never_holds_up_handlers_and_events_arrive_later_bounded(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    await topology.declare(amqp_url, topology.events_queues)
    # The broker refuses every write to the events exchange (and its queue) from now on.
    set_write(rabbit_server, amqp_url, r"^(?!dispatcher\.events$).*")
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS, events_buffer=4)
    handled: list[str] = []

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        handled.append(job.id)

    async with running(consumer):
        await publish(amqp_url, [job("orders.expire", {"order": n}) for n in range(5)])
        await eventually(lambda: len(handled) == 5, 20)
        await depth_reaches(amqp_url, WORK, 0, 10)  # every job acked
        assert consumer.events is not None
        await eventually(lambda: consumer.events is not None and consumer.events.dropped == 6, 5)
        assert consumer.events.pending == 4  # 10 events, the oldest 6 dropped: bounded
        assert consumer.events.published == 0
        set_write(rabbit_server, amqp_url, ".*")
        await eventually(lambda: consumer.events is not None and consumer.events.pending == 0, 20)
    events = await drain_events(amqp_url)
    # The last two jobs' events, in the order reported (one message: one routing key).
    assert [e.outcome for e in events] == ["started", "succeeded", "started", "succeeded"]
    assert {e.job_id for e in events} == set(handled[-2:])
    assert await queue_depth(amqp_url, WORK) == 0


async def test_the_history_reads_each_event_once_and_the_job_moves_to_its_final_state(
    database_url: str,
) -> None:
    job_id = uuid.uuid4()
    connection = await asyncpg.connect(database_url)
    try:
        dispatch_round = await connection.fetchval(
            "INSERT INTO jobs (id, shard, state, routing_key, payload, run_at) "
            "VALUES ($1, 0, 'dispatched', 'orders.expire', '{}', now()) RETURNING dispatch_round",
            job_id,
        )
        db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
        await db.open()
        store = HistoryStore(db)
        now = datetime.now(UTC)

        def event(outcome: str, attempt: int, error: str | None = None) -> contract.JobEvent:
            return contract.JobEvent(
                event_id=str(uuid.uuid4()),
                job_id=str(job_id),
                routing_key="orders.expire",
                group="billing",
                consumer="w1",
                attempt=attempt,
                outcome=outcome,
                error=error,
                at=now.replace(microsecond=attempt),
                dispatch_round=str(dispatch_round),
            )

        first = [event("started", 1), event("dead", 1, "ValueError: x")]
        stranger = dataclasses.replace(
            first[0], event_id=str(uuid.uuid4()), job_id=str(uuid.uuid4())
        )
        recorded = await store.record([*first, stranger])
        assert [entry.ignored for entry in recorded] == [None, None]  # no such job: not kept
        # Redelivered: stored and counted again, read once.
        assert [entry.ignored for entry in await store.record(first)] == [None, None]
        state, error = await connection.fetchrow(
            "SELECT state, last_error FROM jobs WHERE id = $1", job_id
        )
        assert (state, error) == ("dead", "ValueError: x")
        assert [e.outcome for e in await store.events(job_id)] == ["started", "dead"]
        await db.close()
    finally:
        await connection.close()


async def test_nodes_share_one_events_queue_and_the_history_shows_each_event_once(
    database_url: str, amqp_url: str, rabbit_server: RabbitServer
) -> None:
    settings = {"database_url": database_url, "amqp_url": amqp_url, "shard_count": 4}
    async with (
        running_node(node_id="a", **settings) as first,
        running_node(node_id="b", **settings) as second,
        client(second) as http,
    ):
        job_id = (await http.post("/v1/jobs", json={"routing_key": "a.b", "payload": 1})).json()[
            "id"
        ]
        await consumers_reach(amqp_url, contract.EVENTS_QUEUE, 2, 20)
        # Its round: ignored events would be kept only a few to a job.
        known = str(await dispatched.dispatch_round(database_url, job_id))
        events = reporter.EventReporter(amqp_url, group="g", consumer="c")
        events.open()
        for attempt in range(1, 41):
            events.report(
                job_id=job_id,
                routing_key="a.b",
                attempt=attempt,
                outcome="failed",
                dispatch_round=known,
            )
        await events.close(10)
        # A message the SDK sent again (its confirm lost) is counted again.
        await eventually(
            lambda: first.messaging.events.recorded + second.messaging.events.recorded >= 40, 10
        )
        history = (await http.get(f"/v1/jobs/{job_id}")).json()["history"]
    assert [step["attempt"] for step in history if step["event"] == "failed"] == list(range(1, 41))


async def test_a_blocked_broker_never_holds_up_handlers_and_events_follow_once_unblocked(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    def consumer_of(handled: list[str]) -> Consumer:
        made = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
        made.handler("orders.expire")(lambda job: handled.append(job.id))
        return made

    async with running(consumer_of([])):  # declares the queues, then goes away
        pass
    ids = await publish(amqp_url, [job("orders.expire", {"order": n}) for n in range(5)])
    handled: list[str] = []
    consumer = consumer_of(handled)
    # A memory alarm: RabbitMQ stops reading from any connection that publishes.
    await asyncio.to_thread(rabbit_server.ctl, "set_vm_memory_high_watermark", "0.000001")
    try:
        async with running(consumer):
            await eventually(lambda: len(handled) == 5, 20)
            await depth_reaches(amqp_url, WORK, 0, 10)  # handled and acked while blocked
            assert consumer.events is not None
            assert consumer.events.pending > 0  # held back by the block, in memory
            await asyncio.to_thread(rabbit_server.ctl, "set_vm_memory_high_watermark", "0.4")
            await eventually(
                lambda: consumer.events is not None and not consumer.events.pending, 30
            )
    finally:
        await asyncio.to_thread(rabbit_server.ctl, "set_vm_memory_high_watermark", "0.4")
    events = await drain_events(amqp_url)
    assert sorted(e.job_id for e in events if e.outcome == "succeeded") == sorted(ids)


async def test_events_reported_a_millisecond_apart_travel_together_in_few_messages(
    amqp_url: str,
) -> None:
    await topology.declare(amqp_url, topology.events_queues)
    events = reporter.EventReporter(amqp_url, group="billing", consumer="worker-1")
    events.open()
    try:
        started = time.monotonic()
        for _ in range(40):
            events.report(
                job_id=str(uuid.uuid4()),
                routing_key="orders.expire",
                attempt=1,
                outcome="succeeded",
            )
            await asyncio.sleep(0.001)
        reporting_s = time.monotonic() - started
        await eventually(lambda: events.pending == 0, 10)
    finally:
        await events.close(timeout_s=5)
    messages = await drain_event_messages(amqp_url)
    assert sum(len(message) for message in messages) == events.published == 40
    # A round short of a batch waits 20 ms (the documented linger) for more: a message per 20 ms
    # of reporting (two or three for 40 ms), where a round per confirm took one for every event
    # or two (34 of them without the wait). Bounded by the time the loop took, not by 40 ms.
    most = reporting_s / 0.02 + 2
    assert len(messages) <= most, [len(message) for message in messages]
