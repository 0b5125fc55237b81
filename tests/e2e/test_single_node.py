"""A real dispatcher process against real services: crashes, broker restarts, outages.

Each scenario schedules jobs spread over a window, injects the fault, and checks with an
independent consumer that every accepted job arrived (none lost, none early); duplicates are
counted and printed: delivery is at-least-once.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.services.base import service_root
from tests.services.ports import free_port
from tests.services.postgres import PostgresServer
from tests.services.rabbitmq import RabbitServer
from tests.support.collector import Collector
from tests.support.process import DispatcherProcess
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

FAST_LEASE = {"DISPATCHER_LEASE_S": "3", "DISPATCHER_SHARD_COUNT": "32"}


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    process = DispatcherProcess(
        tmp_path,
        port=free_port(),
        env={
            "DISPATCHER_DATABASE_URL": database_url,
            "DISPATCHER_AMQP_URL": amqp_url,
            **FAST_LEASE,
        },
    )
    process.start()
    yield process
    print(process.logs(200))
    process.stop()


async def schedule_spread(
    url: str, count: int, over_s: float, *, start_in_s: float = 1.0
) -> dict[str, float]:
    """Schedule ``count`` jobs due evenly over ``over_s``; returns accepted id -> run_at."""
    base = time.time() + start_in_s
    accepted: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for start in range(0, count, 500):
            jobs = []
            for i in range(start, min(start + 500, count)):
                run_at = datetime.fromtimestamp(base + over_s * i / count, UTC).isoformat()
                jobs.append({"routing_key": "e2e.work", "payload": {"n": i}, "run_at": run_at})
            response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
            assert response.status_code == 201, response.text
            for job in response.json()["jobs"]:
                accepted[job["id"]] = datetime.fromisoformat(job["run_at"]).timestamp()
    return accepted


async def test_kill_9_midway_loses_nothing(
    dispatcher: DispatcherProcess, collector: Collector
) -> None:
    accepted = await schedule_spread(dispatcher.url, 3000, over_s=20)
    await eventually(lambda: len(collector.deliveries) >= 1200, 40)
    dispatcher.kill()
    delivered_before_kill = len(collector.deliveries)
    await asyncio.sleep(1)
    dispatcher.start()
    missing = await collector.wait_for(accepted, 60)
    await collector.settle(1.5)
    ledger = collector.ledger(accepted)
    print(f"\nkill -9 after {delivered_before_kill} deliveries; {ledger}")
    assert missing == set()
    assert ledger.lost == []
    assert ledger.early == []


async def test_broker_restart_midway_loses_nothing(
    dispatcher: DispatcherProcess, collector: Collector, rabbit_server: RabbitServer
) -> None:
    accepted = await schedule_spread(dispatcher.url, 2000, over_s=15)
    await eventually(lambda: len(collector.deliveries) >= 500, 40)
    await asyncio.to_thread(rabbit_server.restart)
    during = await schedule_spread(dispatcher.url, 200, over_s=2)  # accepted while firing resumes
    missing = await collector.wait_for({**accepted, **during}, 90)
    await collector.settle(1.5)
    ledger = collector.ledger({**accepted, **during})
    print(f"\nbroker restarted; {ledger}")
    assert missing == set()
    assert ledger.early == []


async def test_broker_outage_pauses_firing_while_the_api_keeps_accepting(
    dispatcher: DispatcherProcess, collector: Collector, rabbit_server: RabbitServer
) -> None:
    await asyncio.to_thread(rabbit_server.stop_app)
    try:
        accepted = await schedule_spread(dispatcher.url, 300, over_s=1, start_in_s=0.2)
        await asyncio.sleep(3)
        async with httpx.AsyncClient(base_url=dispatcher.url) as http:
            ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["rabbitmq"] is False
    finally:
        await asyncio.to_thread(rabbit_server.start_app)
    # The collector reconnects too; everything accepted during the outage arrives afterwards.
    missing = await collector.wait_for(accepted, 60)
    assert missing == set()


async def test_blocked_broker_pauses_firing_and_resumes_without_loss(
    dispatcher: DispatcherProcess, collector: Collector, rabbit_server: RabbitServer
) -> None:
    # A memory alarm makes RabbitMQ block publishing connections (connection.blocked).
    await asyncio.to_thread(rabbit_server.ctl, "set_vm_memory_high_watermark", "0.000001")
    try:
        accepted = await schedule_spread(dispatcher.url, 300, over_s=1, start_in_s=0.2)
        await asyncio.sleep(3)
        delivered_while_blocked = len(collector.deliveries)
    finally:
        await asyncio.to_thread(rabbit_server.ctl, "set_vm_memory_high_watermark", "0.4")
    missing = await collector.wait_for(accepted, 60)
    await collector.settle(1.0)
    ledger = collector.ledger(accepted)
    print(f"\nbroker blocked for 3s; delivered meanwhile={delivered_while_blocked}; {ledger}")
    assert delivered_while_blocked == 0
    assert missing == set()


async def test_sigterm_stops_gracefully_and_leaves_no_claim_behind(
    dispatcher: DispatcherProcess, collector: Collector, database_url: str
) -> None:
    accepted = await schedule_spread(dispatcher.url, 2000, over_s=4)
    await eventually(lambda: len(collector.deliveries) >= 300, 30)
    assert await asyncio.to_thread(dispatcher.terminate) == 0
    import asyncpg

    connection = await asyncpg.connect(database_url)
    try:
        leased = await connection.fetchval("SELECT count(*) FROM jobs WHERE state = 'dispatching'")
    finally:
        await connection.close()
    assert leased == 0
    dispatcher.start()
    assert await collector.wait_for(accepted, 60) == set()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own, so stopping it disturbs no other test."""
    root = service_root("postgres-own")
    server = PostgresServer(root, free_port())
    server.start()
    server.create_database("dispatcher")
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


async def test_database_outage_answers_503_fast_and_loses_no_accepted_job(
    tmp_path: Path, own_postgres: PostgresServer, amqp_url: str, collector: Collector
) -> None:
    process = DispatcherProcess(
        tmp_path,
        port=free_port(),
        env={
            "DISPATCHER_DATABASE_URL": own_postgres.dsn("dispatcher"),
            "DISPATCHER_AMQP_URL": amqp_url,
            **FAST_LEASE,
        },
    )
    process.start()
    try:
        accepted = await schedule_spread(process.url, 500, over_s=6)
        await asyncio.to_thread(own_postgres.kill)
        async with httpx.AsyncClient(base_url=process.url, timeout=30) as http:
            started = time.monotonic()
            refused = await http.post("/v1/jobs", json={"routing_key": "e2e.work", "payload": 1})
            answered_in = time.monotonic() - started
        assert refused.status_code == 503
        assert refused.json()["error"] == "unavailable"
        assert answered_in < 10  # a hang guard, not a speed figure: the limit is db_timeout_s=2
        await asyncio.sleep(2)
        await asyncio.to_thread(own_postgres.start)
        accepted |= await schedule_spread(process.url, 100, over_s=1)
        missing = await collector.wait_for(accepted, 60)
        await collector.settle(1.0)
        print(f"\npostgres crashed and restarted; {collector.ledger(accepted)}")
        assert missing == set()
    finally:
        print(process.logs(40))
        process.stop()
