"""A job's own retry policy (its x-retry- headers) against a real RabbitMQ: it overrides the
handler's max_attempts and backoff, mapped onto the consumer's delay tiers."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import aio_pika
import pytest

from consumers_sdk import Consumer, Job, contract, topology
from devstack.jobs_out import job, publish
from dispatcher import models
from tests.support.consumers import running
from tests.support.queues import depth_reaches
from tests.support.waiting import eventually

# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version


TIERS = (0.3, 0.6, 1.2)
WORK = "billing.orders.expire"


def fixed(seconds: float) -> Callable[[int], float]:
    return lambda _attempt: seconds


def with_policy(
    payload: Any, *, max_attempts: int | None = None, backoff_s: list[float] | None = None
) -> models.Claimed:
    plain = job("orders.expire", payload)
    policy = contract.retry_policy_headers(max_attempts=max_attempts, backoff_s=backoff_s)
    return dataclasses.replace(plain, headers={**plain.headers, **policy})


def waited_in(message_headers: Mapping[str, object]) -> str | None:
    """The wait queue a delivery came back from: the latest entry of RabbitMQ's x-death (the
    first; RabbitMQ 4 keeps only its own entries, not those a client republished)."""
    deaths = message_headers.get("x-death")
    assert isinstance(deaths, list) or deaths is None
    latest = next((death for death in deaths or [] if isinstance(death, Mapping)), None)
    return None if latest is None else str(latest["queue"])


async def dead_headers(amqp_url: str) -> list[dict[str, Any]]:
    connection = await aio_pika.connect(amqp_url)
    found = []
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.dead_queue(WORK), passive=True)
        # Left unacked: they go back to the queue when the connection closes.
        while (message := await queue.get(no_ack=False, fail=False)) is not None:
            found.append(dict(message.headers))
    finally:
        await connection.close()
    return found


async def test_a_jobs_max_attempts_overrides_the_handlers_both_lower_and_higher(
    amqp_url: str,
) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
    attempts: dict[str, list[int]] = {"two": [], "six": [], "default": []}

    @consumer.handler("orders.expire", max_attempts=4, backoff=fixed(0.3))
    async def expire(job: Job) -> None:
        attempts[job.payload].append(job.attempt)
        raise ValueError("boom")

    async with running(consumer):
        await publish(
            amqp_url,
            [
                with_policy("two", max_attempts=2),
                with_policy("six", max_attempts=6),
                with_policy("default"),
            ],
        )
        await depth_reaches(amqp_url, topology.dead_queue(WORK), 3, 60)
        await asyncio.sleep(0.5)  # room for a wrong extra delivery
    assert attempts == {"two": [1, 2], "six": [1, 2, 3, 4, 5, 6], "default": [1, 2, 3, 4]}
    dead = {headers["x-job-id"]: headers for headers in await dead_headers(amqp_url)}
    assert sorted(headers["x-dead-attempts"] for headers in dead.values()) == [2, 4, 6]
    # The policy stays with the dead job: revived, it keeps its own limit.
    assert sorted(headers.get(contract.HEADER_MAX_ATTEMPTS, 0) for headers in dead.values()) == [
        0,
        2,
        6,
    ]


async def test_a_jobs_backoff_picks_the_delay_tier_over_the_handlers(amqp_url: str) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
    waits: dict[str, list[str | None]] = {"own": [], "default": []}

    @consumer.handler("orders.expire", max_attempts=3, backoff=fixed(1.2))
    async def expire(job: Job) -> None:
        waits[job.payload].append(waited_in(job.message.headers or {}))
        if job.attempt < 3:
            raise RuntimeError("again")

    async with running(consumer):
        # 0.2 s rounds up to the 0.3 s tier, 0.5 s to 0.6 s; the handler's own 1.2 s otherwise.
        await publish(amqp_url, [with_policy("own", backoff_s=[0.2, 0.5]), with_policy("default")])
        await eventually(lambda: len(waits["own"]) == 3 and len(waits["default"]) == 3, 30)
    tier = {seconds: topology.wait_queue(WORK, seconds) for seconds in TIERS}
    assert waits["own"] == [None, tier[0.3], tier[0.6]]
    assert waits["default"] == [None, tier[1.2], tier[1.2]]
