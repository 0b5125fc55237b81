"""``dlq.requeue`` with a lookup moves or drops nothing on a guess: when the dispatcher cannot
answer, every dead copy stays in ``.dead`` and the error says so."""

from __future__ import annotations

import pytest

from consumers_sdk import Consumer, Job, dlq, dlq_check, topology
from consumers_sdk.errors import DlqError
from devstack.jobs_out import job, publish
from devstack.ports import reserve_port
from tests.support.consumers import running
from tests.support.queues import depth_reaches, queue_depth

WORK = "billing.orders.expire"
DEAD = topology.dead_queue(WORK)


async def test_a_dispatcher_that_cannot_answer_leaves_every_dead_copy_in_place(
    amqp_url: str,
) -> None:
    consumer = Consumer(amqp_url, group="billing", report_events=False)

    @consumer.handler("orders.expire", max_attempts=1)
    async def expire(job: Job) -> None:
        raise RuntimeError("downstream is down")

    async with running(consumer):
        await publish(amqp_url, [job("orders.expire", 1), job("orders.expire", 2)])
        await depth_reaches(amqp_url, DEAD, 2, 30)

    nobody = f"http://127.0.0.1:{reserve_port()}"  # nothing listens there
    async with dlq_check.JobLookup(nobody, timeout_s=5) as lookup:
        with pytest.raises(
            DlqError, match="moved 0, dropped 0, then: could not ask the dispatcher"
        ):
            await dlq.requeue(amqp_url, DEAD, lookup=lookup)
    await depth_reaches(amqp_url, DEAD, 2, 30)  # handed back unacked, none dropped
    assert await queue_depth(amqp_url, WORK) == 0  # and none moved
