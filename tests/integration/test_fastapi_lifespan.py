"""consumer_lifespan() in a FastAPI application served by uvicorn, against a real RabbitMQ: the
consumer handles jobs while the application serves, and the server's shutdown lets the running
handler finish and acks it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from consumers_sdk import Consumer, Job, retry, topology
from consumers_sdk.integrations.fastapi import consumer_lifespan
from devstack.jobs_out import job, publish
from devstack.ports import reserve_port
from tests.support.queues import queue_depth
from tests.support.waiting import eventually, until

WORK = topology.work_queue("web", "orders.expire")


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[tuple[uvicorn.Server, str]]:
    """The application under uvicorn in this event loop, until the block ends (a graceful
    shutdown, as on SIGTERM) or the server stops by itself."""
    port = reserve_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan="on", ws="none", log_config=None
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="uvicorn")
    try:
        await eventually(lambda: server.started or task.done(), 60)
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 60)


async def test_the_app_consumes_while_it_serves_and_its_shutdown_finishes_the_running_job(
    amqp_url: str,
) -> None:
    consumer = Consumer(amqp_url, group="web", report_events=False)
    handled: list[str] = []
    started: list[str] = []

    @consumer.handler("orders.expire", timeout=60)
    async def expire(job: Job) -> None:
        started.append(job.id)
        await asyncio.sleep(job.payload["sleep_s"])
        handled.append(job.id)

    app = FastAPI(lifespan=consumer_lifespan(consumer))

    @app.get("/handled")
    async def handled_jobs() -> list[str]:
        return handled

    async with serving(app) as (server, base_url):
        assert server.started
        assert consumer.ready.is_set()  # startup waited until it consumed
        [quick] = await publish(amqp_url, [job("orders.expire", {"sleep_s": 0})])
        async with httpx.AsyncClient(base_url=base_url) as http:

            async def served_as_handled() -> bool:
                response = await http.get("/handled")
                assert response.status_code == 200
                return quick in response.json()

            await until(served_as_handled, 30)
        [slow] = await publish(amqp_url, [job("orders.expire", {"sleep_s": 2})])
        await eventually(lambda: slow in started, 30)
        assert slow not in handled
    # The server has stopped: the job that was running when it began to stop ran to its end...
    assert handled == [quick, slow]
    # ...and was acked, not handed back: nothing waits in its queue, nothing died or waits to retry.
    waits = (topology.wait_queue(WORK, tier) for tier in retry.DEFAULT_TIERS)
    for queue in (WORK, topology.dead_queue(WORK), *waits):
        assert await queue_depth(amqp_url, queue) == 0, queue


async def test_a_consumer_that_cannot_start_fails_the_startup_with_its_own_error() -> None:
    consumer = Consumer("amqp://guest:guest@127.0.0.1:1/", group="web", report_events=False)
    with pytest.raises(ValueError, match="no handler registered"):
        await consumer_lifespan(consumer).__aenter__()


async def test_a_consumer_not_consuming_in_time_fails_the_startup_and_leaves_no_task() -> None:
    unreachable = f"amqp://guest:guest@127.0.0.1:{reserve_port()}/"
    consumer = Consumer(unreachable, group="web", report_events=False)

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None: ...

    with pytest.raises(TimeoutError, match="not consuming after 1s"):
        await consumer_lifespan(consumer, ready_timeout_s=1).__aenter__()
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("consumer")] == []
