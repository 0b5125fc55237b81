"""A node's lifecycle against real services: it stops when asked in whatever state it is in
(RabbitMQ never reached, PostgreSQL or ZooKeeper gone or never there, a catch-up under way, a
loop failing), and a loop that fails is restarted and shown in /readyz meanwhile instead of
stopping the node."""

from __future__ import annotations

import asyncio
import shutil

import asyncpg

from devstack.base import service_root
from devstack.collector import Collector
from devstack.ports import reserve_port
from devstack.postgres import PostgresServer
from devstack.zookeeper import ZooKeeperServer
from dispatcher import lifecycle
from dispatcher.node import Node
from dispatcher.settings import Settings
from tests.support.nodes import client, running_node
from tests.support.overdue import insert_overdue
from tests.support.waiting import eventually, until

# A hang guard, not a speed figure: the drain timeout plus the slack of a loaded machine.
STOP_GUARD_S = lifecycle.DRAIN_TIMEOUT_S + 10
SHARDS = 8


def started(settings: Settings) -> tuple[Node, asyncio.Task[None]]:
    node = Node(settings)
    return node, asyncio.create_task(node.run(serve_http=False), name="lifecycle-node")


def in_cluster(database_url: str, amqp_url: str, zk_hosts: str) -> Settings:
    return Settings(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=SHARDS,
        zk_hosts=zk_hosts,
        zk_session_timeout_s=4,
    )


async def stops_when_asked(node: Node, task: asyncio.Task[None]) -> None:
    """Ask the node to stop; it returns (no task left running) within the guard."""
    node.request_stop()
    await asyncio.wait_for(task, STOP_GUARD_S)
    assert task.done()


async def job_states(database_url: str) -> dict[str, str]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT id::text, state FROM jobs")
    finally:
        await connection.close()
    return {row["id"]: row["state"] for row in rows}


async def test_a_node_whose_broker_never_answered_stops_when_asked(database_url: str) -> None:
    nowhere = f"amqp://guest:guest@127.0.0.1:{reserve_port()}/"
    node = Node(Settings(database_url=database_url, amqp_url=nowhere, shard_count=8))
    task = asyncio.create_task(node.run(serve_http=False))
    await asyncio.wait_for(node.started.wait(), 30)
    await asyncio.sleep(1.0)  # the connect loops are retrying
    assert not node.messaging.publisher.is_ready()
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
        purge = node.upkeep.housekeeper.purge
        failed = asyncio.Event()

        async def failing_purge() -> int:
            nonlocal failures
            failures += 1
            if failures <= 2:
                failed.set()
                raise RuntimeError("a bug in housekeeping")
            return await purge()

        node.upkeep.housekeeper.purge = failing_purge  # type: ignore[method-assign]
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
    # The loops' part: a loaded machine may also find a service slow to answer ("standing").
    shown = {name: why for name, why in degraded.json()["degraded"].items() if name != "standing"}
    assert shown == {"housekeeping": "RuntimeError: a bug in housekeeping"}
    assert "degraded" not in ready.json()


async def test_a_node_started_before_its_database_waits_for_it_and_then_fires(
    amqp_url: str, collector: Collector
) -> None:
    server = PostgresServer(service_root("postgres-late"), reserve_port())
    # The server's own database: it exists as soon as the server answers.
    node = Node(Settings(database_url=server.dsn("postgres"), amqp_url=amqp_url, shard_count=8))
    task = asyncio.create_task(node.run(serve_http=False))
    try:
        await asyncio.sleep(1.5)  # retrying: nothing listens on the port yet
        assert not task.done()
        assert not node.started.is_set()
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(node.started.wait(), 60)
        await asyncio.wait_for(node.messaging.publisher.wait_ready(), 30)
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
    nowhere = f"postgresql://postgres@127.0.0.1:{reserve_port()}/dispatcher"
    node = Node(Settings(database_url=nowhere, amqp_url=amqp_url, shard_count=8))
    task = asyncio.create_task(node.run(serve_http=False))
    await asyncio.sleep(1.0)
    assert not task.done()  # retrying, not exited
    node.request_stop()
    await asyncio.wait_for(task, STOP_GUARD_S)
    assert not node.started.is_set()


async def test_a_node_whose_database_went_away_stops_when_asked(
    own_postgres: PostgresServer, amqp_url: str
) -> None:
    settings = Settings(
        database_url=own_postgres.dsn("dispatcher"), amqp_url=amqp_url, shard_count=SHARDS
    )
    node, task = started(settings)
    try:
        await asyncio.wait_for(node.started.wait(), 60)
        await asyncio.wait_for(node.messaging.publisher.wait_ready(), 30)
        await asyncio.to_thread(own_postgres.kill)

        async def database_gone() -> bool:
            return not (await node.status.readiness())["postgres"]

        await until(database_gone, 30)
        await stops_when_asked(node, task)
    finally:
        task.cancel()


async def test_a_node_whose_zookeeper_went_away_stops_when_asked(
    own_zookeeper: ZooKeeperServer, database_url: str, amqp_url: str
) -> None:
    node, task = started(in_cluster(database_url, amqp_url, f"{own_zookeeper.hosts}/lifecycle"))
    try:
        await asyncio.wait_for(node.started.wait(), 60)
        await eventually(node.coordination.ownership.can_fire, 30)  # joined, owns shards, may fire
        await asyncio.to_thread(own_zookeeper.kill)
        await eventually(
            lambda: not node.coordination.ownership.can_fire(), 30
        )  # fenced: ZooKeeper is gone
        await stops_when_asked(node, task)
    finally:
        task.cancel()


async def test_a_node_whose_zookeeper_never_answered_stops_when_asked(
    database_url: str, amqp_url: str
) -> None:
    node, task = started(in_cluster(database_url, amqp_url, f"127.0.0.1:{reserve_port()}"))
    try:
        await asyncio.sleep(1.0)  # retrying to join: nothing listens on the port
        assert not task.done()
        await stops_when_asked(node, task)
        assert not node.started.is_set()
    finally:
        task.cancel()


async def test_a_node_stopped_mid_catch_up_leaves_each_job_dispatched_or_scheduled(
    database_url: str, amqp_url: str, collector: Collector
) -> None:
    overdue = await insert_overdue(database_url, 3000, SHARDS, routing_key="catchup.work")
    # Paced so the catch-up lasts well past the moment the stop arrives.
    settings = Settings(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=SHARDS,
        catchup_max_rate=300,
        fire_batch=50,
    )
    node, task = started(settings)
    try:
        assert await collector.wait_for_count(300, 60) == 0  # the catch-up is under way
        await stops_when_asked(node, task)
    finally:
        task.cancel()
    states = await job_states(database_url)
    assert states.keys() == overdue.keys()
    # Drained, not cut off: no batch was left claimed for a lease to bring back.
    assert set(states.values()) <= {"dispatched", "scheduled"}
    dispatched = {job_id for job_id, state in states.items() if state == "dispatched"}
    assert 0 < len(dispatched) < len(overdue)  # stopped mid-way
    assert await collector.wait_for(dispatched, 30) == set()  # each one marked was delivered
    # The rest wait, scheduled, for the next node: none was lost.
    async with running_node(database_url=database_url, amqp_url=amqp_url, shard_count=SHARDS):
        assert await collector.wait_for(overdue, 90) == set()
