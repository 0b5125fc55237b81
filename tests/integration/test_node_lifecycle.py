"""A node's lifecycle against real services: it stops when asked in whatever state it is in
(RabbitMQ never reached, a loop failing), and a loop that fails is restarted and shown in
/readyz meanwhile instead of stopping the node."""

from __future__ import annotations

import asyncio
import shutil

from dispatcher import node as node_mod
from dispatcher.node import Node
from dispatcher.settings import Settings
from tests.services.base import service_root
from tests.services.ports import free_port
from tests.services.postgres import PostgresServer
from tests.support.collector import Collector
from tests.support.nodes import client, running_node

# A hang guard, not a speed figure: the drain timeout plus the slack of a loaded machine.
STOP_GUARD_S = node_mod.DRAIN_TIMEOUT_S + 10


async def test_a_node_whose_broker_never_answered_stops_when_asked(database_url: str) -> None:
    nowhere = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    node = Node(Settings(database_url=database_url, amqp_url=nowhere, shard_count=8))
    task = asyncio.create_task(node.run(serve_http=False))
    await asyncio.wait_for(node.started.wait(), 30)
    await asyncio.sleep(1.0)  # the connect loops are retrying
    assert not node.publisher.is_ready()
    async with client(node) as http:
        ready = await http.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["rabbitmq"] is False
    node.request_stop()
    await asyncio.wait_for(task, STOP_GUARD_S)  # returns: no task was left running


async def test_a_failing_loop_is_restarted_and_shown_degraded_while_the_node_fires(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, shard_count=8, stats_interval_s=0.2
    ) as node:
        failures = 0
        purge = node.housekeeper.purge
        failed = asyncio.Event()

        async def failing_purge() -> int:
            nonlocal failures
            failures += 1
            if failures <= 2:
                failed.set()
                raise RuntimeError("a bug in housekeeping")
            return await purge()

        node.housekeeper.purge = failing_purge  # type: ignore[method-assign]
        async with client(node) as http:
            await asyncio.wait_for(failed.wait(), 10)
            degraded = await http.get("/readyz")
            job = await http.post("/v1/jobs", json={"routing_key": "loops.work", "payload": 1})
            assert await collector.wait_for([job.json()["id"]], 10) == set()
            # Restarted after its backoff, it runs past HEALTHY_AFTER_S and is healthy again.
            async with asyncio.timeout(30):
                while (ready := await http.get("/readyz")).status_code != 200:  # noqa: ASYNC110
                    await asyncio.sleep(0.2)
        assert failures > 2
    assert degraded.status_code == 503
    assert degraded.json()["checks"]["loops"] is False
    assert degraded.json()["degraded"] == {"housekeeping": "RuntimeError: a bug in housekeeping"}
    assert "degraded" not in ready.json()


async def test_a_node_started_before_its_database_waits_for_it_and_then_fires(
    amqp_url: str, collector: Collector
) -> None:
    server = PostgresServer(service_root("postgres-late"), free_port())
    # The server's own database: it exists as soon as the server answers.
    node = Node(Settings(database_url=server.dsn("postgres"), amqp_url=amqp_url, shard_count=8))
    task = asyncio.create_task(node.run(serve_http=False))
    try:
        await asyncio.sleep(1.5)  # retrying: nothing listens on the port yet
        assert not task.done()
        assert not node.started.is_set()
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(node.started.wait(), 60)
        await asyncio.wait_for(node.publisher.wait_ready(), 30)
        async with client(node) as http:
            job = await http.post("/v1/jobs", json={"routing_key": "late.work", "payload": 1})
        assert job.status_code == 201, job.text
        assert await collector.wait_for([job.json()["id"]], 10) == set()
        node.request_stop()
        await asyncio.wait_for(task, STOP_GUARD_S)
    finally:
        task.cancel()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(server.root, ignore_errors=True)


async def test_a_node_whose_database_never_answered_stops_when_asked(amqp_url: str) -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/dispatcher"
    node = Node(Settings(database_url=nowhere, amqp_url=amqp_url, shard_count=8))
    task = asyncio.create_task(node.run(serve_http=False))
    await asyncio.sleep(1.0)
    assert not task.done()  # retrying, not exited
    node.request_stop()
    await asyncio.wait_for(task, STOP_GUARD_S)
    assert not node.started.is_set()
