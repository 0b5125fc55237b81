"""What each RabbitMQ version does with a job's priority in the SDK's queues (quorum queues):
3.x delivers in the order published, whatever the priority; 4.x delivers two high ones (priority
5-9) for each normal one (0-4, or none) while both wait. The dispatcher's own firing order
honours priority on every version (``tests/unit/test_heap.py``, ``test_priorities.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from consumers_sdk import Consumer, Job
from devstack.jobs_out import job, publish
from devstack.rabbitmq import RabbitServer
from tests.support.consumers import running
from tests.support.queues import depth_reaches
from tests.support.waiting import eventually

pytestmark = pytest.mark.rabbitmq_version

KEY = "reports.build"


async def test_the_broker_orders_a_queues_jobs_by_priority_as_its_version_can(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    declared = Consumer(amqp_url, group="reports", prefetch=1)

    @declared.handler(KEY)
    async def declare_only(job: Job) -> None:  # run once to declare the queues, then stopped
        raise AssertionError("nothing is published yet")

    async with running(declared):
        pass
    normal = [dataclasses.replace(job(KEY, n), priority=n % 5) for n in range(10)]
    high = [dataclasses.replace(job(KEY, 10 + n), priority=9) for n in range(10)]
    await publish(amqp_url, normal + high)  # the normal ones first
    await depth_reaches(amqp_url, f"reports.{KEY}", 20, 10)

    consumer = Consumer(amqp_url, group="reports", prefetch=1)
    order: list[int] = []

    @consumer.handler(KEY)
    async def build(job: Job) -> None:
        order.append(job.message.priority or 0)

    async with running(consumer):
        await eventually(lambda: len(order) == 20, 20)
    print(f"RabbitMQ {rabbit_server.major}.x delivered the priorities in this order: {order}")
    if rabbit_server.major >= 4:
        # 10 normal jobs, then 10 high ones: high, high, normal, ... until the high ones ran out.
        assert ["high" if seen > 4 else "normal" for seen in order[:15]] == 5 * [
            "high",
            "high",
            "normal",
        ], order
    else:
        assert order == [item.priority for item in normal + high]
