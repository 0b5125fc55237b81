"""Queue names and arguments, from tiny pure functions, and their idempotent declaration.

For a handler of group ``billing`` on routing key ``orders.expire``:

    billing.orders.expire                work queue, bound to dispatcher.jobs with the key;
                                         dead-letters to .dead (past the quorum delivery limit,
                                         or the job's own ttl ran out while it waited here)
    billing.orders.expire.retry.<tier>   wait queue per delay tier: TTL = tier, then dead-letters
                                         back to the work queue (default exchange, queue name)
    billing.orders.expire.dead           dead jobs: max attempts, Reject, undecodable, or the above

Wait queues belong to one work queue (not shared by the group) so the RabbitMQ UI shows which
handler's jobs are waiting, and deleting a handler's queues leaves the others alone. Quorum
queues (the default) dead-letter at-least-once, which needs ``x-overflow: reject-publish``;
classic queues dead-letter at-most-once (no confirms inside the broker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractQueue, FieldValue

from consumers_sdk import contract

QueueType = Literal["quorum", "classic"]
DEAD_SUFFIX = ".dead"
# A message that keeps killing its consumer (redelivered this often) goes to .dead.
POISON_DELIVERY_LIMIT = 50


def work_queue(group: str, routing_key: str) -> str:
    return f"{group}.{routing_key}"


def tier_label(tier_s: float) -> str:
    milliseconds = round(tier_s * 1000)
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def wait_queue(work: str, tier_s: float) -> str:
    return f"{work}.retry.{tier_label(tier_s)}"


def dead_queue(work: str) -> str:
    return f"{work}{DEAD_SUFFIX}"


def _typed(queue_type: QueueType) -> dict[str, FieldValue]:
    if queue_type == "classic":
        return {}
    # Quorum queues are the only type whose dead-lettering is at-least-once.
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def work_arguments(work: str, queue_type: QueueType) -> dict[str, FieldValue]:
    arguments = _typed(queue_type)
    arguments["x-dead-letter-exchange"] = ""
    arguments["x-dead-letter-routing-key"] = dead_queue(work)
    if queue_type == "quorum":
        arguments["x-delivery-limit"] = POISON_DELIVERY_LIMIT
    return arguments


def wait_arguments(work: str, tier_s: float, queue_type: QueueType) -> dict[str, FieldValue]:
    arguments = _typed(queue_type)
    arguments["x-message-ttl"] = round(tier_s * 1000)
    arguments["x-dead-letter-exchange"] = ""
    arguments["x-dead-letter-routing-key"] = work
    return arguments


def dead_arguments(queue_type: QueueType) -> dict[str, FieldValue]:
    return {"x-queue-type": "quorum"} if queue_type == "quorum" else {}


async def declare(
    channel: AbstractChannel,
    *,
    work: str,
    routing_key: str,
    tiers: Sequence[float],
    queue_type: QueueType,
    exchange: str = contract.EXCHANGE,
) -> AbstractQueue:
    """Declare the work queue with its wait and dead queues (idempotent); returns the work queue."""
    jobs = await channel.declare_exchange(
        exchange,
        aio_pika.ExchangeType.TOPIC,
        durable=True,
        arguments=dict[str, FieldValue](contract.exchange_arguments()),
    )
    await channel.declare_queue(
        dead_queue(work), durable=True, arguments=dead_arguments(queue_type)
    )
    for tier in tiers:
        await channel.declare_queue(
            wait_queue(work, tier), durable=True, arguments=wait_arguments(work, tier, queue_type)
        )
    queue = await channel.declare_queue(
        work, durable=True, arguments=work_arguments(work, queue_type)
    )
    await queue.bind(jobs, routing_key)
    return queue


async def declare_events(channel: AbstractChannel) -> AbstractQueue:
    """The events exchange and the dispatchers' shared queue bound to it (idempotent; both the
    SDK and the dispatcher declare them, so events published before any dispatcher ran wait in
    the queue instead of being dropped)."""
    events = await channel.declare_exchange(
        contract.EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
    )
    queue = await channel.declare_queue(
        contract.EVENTS_QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
    )
    await queue.bind(events, "#")
    return queue
