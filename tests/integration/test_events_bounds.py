"""What the events consumer holds, on a real broker: at most its prefetch of messages, each read
only when it is small enough (a larger one is acked unread and counted), and what it logs of a
refused message is a few hundred characters, whatever the message held."""

from __future__ import annotations

import logging
import uuid

import orjson
import pytest

from consumers_sdk import contract, management, topology
from devstack.rabbitmq import RabbitServer
from dispatcher.node import Node
from tests.integration.test_broker_limits import event_for, put, recorded, stored_job
from tests.support.nodes import running_node
from tests.support.queues import consumers_reach, depth_reaches, wait_for_queue
from tests.support.waiting import eventually, until

# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version

MAX_BYTES = 64 * 1024


def dropped_total(node: Node) -> float:
    value = node.core.metrics.registry.get_sample_value(
        "dispatcher_events_dropped_total", {"reason": "too_large"}
    )
    return value or 0.0


def refused_total(node: Node) -> float:
    return node.core.metrics.registry.get_sample_value("dispatcher_events_refused_total") or 0.0


async def consuming(amqp_url: str) -> None:
    # The node declares the events queue on its own connection, once its publishers are up.
    await wait_for_queue(amqp_url, contract.EVENTS_QUEUE)
    await consumers_reach(amqp_url, contract.EVENTS_QUEUE, 1, 30)


async def test_an_events_message_past_the_bound_is_acked_unread_and_counted(
    database_url: str, amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = await stored_job(database_url, amqp_url)
    small, padded = event_for(job_id), event_for(job_id)
    # Valid JSON (whitespace may follow it): only its size keeps it from being recorded.
    large = contract.encode_events([padded]) + b" " * MAX_BYTES
    caplog.set_level(logging.WARNING, logger="dispatcher.amqp.events")
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=2,
        events_max_message_bytes=MAX_BYTES,
    ) as node:
        await consuming(amqp_url)
        await put(
            amqp_url,
            contract.EVENTS_QUEUE,
            [large, contract.encode_events([small])],
            ids=["large", "small"],
        )
        await until(lambda: recorded(database_url, small.event_id), 20)
        await eventually(lambda: dropped_total(node) == 1, 10)
        # Acked: neither redelivered nor dead-lettered (its bytes stay out of the broker).
        await depth_reaches(amqp_url, contract.EVENTS_QUEUE, 0, 10)
        await depth_reaches(amqp_url, topology.EVENTS_DEAD_QUEUE, 0, 10)
        assert refused_total(node) == 0
    assert not await recorded(database_url, padded.event_id)
    assert f"dropped a message of {len(large)} bytes (too_large" in caplog.text


async def test_a_refused_message_is_logged_in_a_few_hundred_characters(
    database_url: str, amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = await stored_job(database_url, amqp_url)
    event = orjson.loads(contract.encode_event(event_for(job_id)))
    event["outcome"] = "x" * 200_000  # within the bound, and not an outcome
    caplog.set_level(logging.WARNING, logger="dispatcher.amqp.events")
    async with running_node(database_url=database_url, amqp_url=amqp_url, shard_count=2) as node:
        await consuming(amqp_url)
        await put(amqp_url, contract.EVENTS_QUEUE, [orjson.dumps(event)], ids=[str(uuid.uuid4())])
        await eventually(lambda: refused_total(node) == 1, 20)
    [line] = [r.getMessage() for r in caplog.records if "refused a message" in r.getMessage()]
    assert "unknown outcome 'xxx" in line
    assert len(line) < 400
    assert line.endswith("more characters)")


async def test_the_events_consumer_holds_at_most_its_prefetch_of_64_by_default(
    database_url: str, amqp_url: str, rabbit_server: RabbitServer
) -> None:
    """64 messages of at most 256 KiB: 16 MiB of bodies at most (it was 1 000 of 16 MiB)."""
    async with running_node(database_url=database_url, amqp_url=amqp_url, shard_count=2):
        await consuming(amqp_url)
        listed = rabbit_server.ctl(
            "list_consumers",
            "-p",
            management.vhost(amqp_url),
            "queue_name",
            "prefetch_count",
            "-q",
            "--no-table-headers",
        )
    rows = [line.split("\t") for line in listed.splitlines() if line.strip()]
    assert [contract.EVENTS_QUEUE, "64"] in [row[:2] for row in rows]
