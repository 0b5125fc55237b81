"""Looking at RabbitMQ queues from outside: does one exist, how deep is it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aio_pika

from consumers_sdk import job as job_mod


async def queue_exists(amqp_url: str, name: str) -> bool:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(name, passive=True)
        return True
    except aio_pika.exceptions.ChannelClosed:
        return False
    finally:
        await connection.close()


async def wait_for_queue(amqp_url: str, name: str) -> None:
    async with asyncio.timeout(30):
        while not await queue_exists(amqp_url, name):  # noqa: ASYNC110 - another process declares it
            await asyncio.sleep(0.2)


async def wait_for_consumer(amqp_url: str, name: str, deadline_s: float = 60) -> None:
    """Until a consumer takes from queue NAME: the SDK binds a queue after declaring it and
    consumes once bound, so a job published when the queue merely exists may route nowhere."""
    async with asyncio.timeout(deadline_s):
        while not await queue_exists(amqp_url, name) or not await consumer_count(amqp_url, name):  # noqa: ASYNC110 - another process consumes
            await asyncio.sleep(0.2)


async def _declared(amqp_url: str, name: str) -> tuple[int, int]:
    """(messages, consumers) of a queue, as a passive declaration reports them (the management
    API's counts need its metrics, which RabbitMQ 4 can turn off)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        result = (await channel.declare_queue(name, passive=True)).declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)
    finally:
        await connection.close()


async def queue_depth(amqp_url: str, name: str) -> int:
    return (await _declared(amqp_url, name))[0]


async def _reaches(
    read: Callable[[], Awaitable[int]],
    expected: int,
    deadline_s: float,
    poll_s: float,
    *,
    at_least: bool = False,
) -> None:
    """Until READ gives EXPECTED (AT_LEAST: EXPECTED or more); past DEADLINE_S, an assertion that
    shows what it read instead (each value and when it was first read), so a failure says how
    far the broker got."""
    seen: list[tuple[float, int]] = []
    started = time.monotonic()
    try:
        async with asyncio.timeout(deadline_s):
            while (got := await read()) != expected and not (at_least and got > expected):
                if not seen or seen[-1][1] != got:
                    seen.append((time.monotonic() - started, got))
                await asyncio.sleep(poll_s)
    except TimeoutError:
        trace = ", ".join(f"{value} at {at:.1f}s" for at, value in seen[-20:])
        raise AssertionError(f"never read {expected} in {deadline_s:.0f}s; read {trace}") from None


async def depth_reaches(
    amqp_url: str, name: str, depth: int, deadline_s: float, *, at_least: bool = False
) -> None:
    await _reaches(lambda: queue_depth(amqp_url, name), depth, deadline_s, 0.1, at_least=at_least)


async def consumer_count(amqp_url: str, name: str) -> int:
    return (await _declared(amqp_url, name))[1]


async def consumers_reach(amqp_url: str, name: str, count: int, deadline_s: float) -> None:
    await _reaches(lambda: consumer_count(amqp_url, name), count, deadline_s, 0.2)


async def drain_dead(amqp_url: str, queue_name: str) -> dict[str, list[float]]:
    """Consume (and ack) everything in a dead-letter queue: message id -> times taken."""
    taken: dict[str, list[float]] = {}
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(queue_name, passive=True)
        while (message := await queue.get(fail=False)) is not None:
            assert message.headers.get(job_mod.DEAD_ERROR), "a dead job carries its reason"
            taken.setdefault(message.message_id or "", []).append(time.time())
            await message.ack()
    finally:
        await connection.close()
    return taken
