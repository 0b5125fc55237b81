"""enqueue() with a real dispatcher process, on asyncpg and on psycopg (sync and async): a job
enqueued in a transaction that rolls back is never published; one whose transaction commits is
delivered like any other."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import orjson
import psycopg
import pytest

from consumers_sdk import contract
from consumers_sdk.enqueue import EnqueuedJob, enqueue, enqueue_sync
from devstack.collector import Collector
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from tests.support.process import served

pytestmark = pytest.mark.e2e

# A job committed behind the loader's cursor reaches the heap through its due notice; the safety
# sweep would find it too, but only after this grace, longer than the test waits.
SWEEP_GRACE_S = 120.0


@pytest.fixture
def node(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    env = {**FAST_LEASE, "DISPATCHER_SWEEP_GRACE_S": str(SWEEP_GRACE_S)}
    yield from served(tmp_path, database_url, amqp_url, env=env)


async def test_only_the_committed_transactions_job_is_published(
    node: DispatcherProcess, collector: Collector, database_url: str
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL)")
        transaction = conn.transaction()
        await transaction.start()
        await conn.execute("INSERT INTO orders VALUES (1, 'placed')")
        rolled_back = await enqueue(conn, "orders.expire", {"order": 1}, delay=1.0)
        await transaction.rollback()
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (2, 'placed')")
            committed = await enqueue(
                conn, "orders.expire", {"order": 2}, delay=1.0, max_attempts=2, retry_backoff=[5]
            )
            due_now = await enqueue(conn, "orders.expire", {"order": 3})
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE id = $1", rolled_back.id) == 0
    finally:
        await conn.close()

    assert await collector.wait_for([committed.id, due_now.id], 30) == set()
    [delivery] = collector.deliveries[committed.id]
    assert delivery.message_id == committed.id
    assert orjson.loads(delivery.body) == {"order": 2}
    assert delivery.received_at >= committed.run_at.timestamp()
    assert delivery.headers["x-job-id"] == committed.id
    assert delivery.headers[contract.HEADER_MAX_ATTEMPTS] == 2
    assert delivery.headers[contract.HEADER_RETRY_BACKOFF] == "5"
    # Well past the rolled-back job's due time: it never comes (there is no row to sweep either).
    remaining = rolled_back.run_at.timestamp() + 5.0 - time.time()
    await asyncio.sleep(max(remaining, 0))
    await collector.settle()
    assert set(collector.deliveries) == {committed.id, due_now.id}
    assert node.is_running()


def committed_and_rolled_back_sync(database_url: str) -> tuple[EnqueuedJob, EnqueuedJob]:
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            rolled_back = enqueue_sync(conn, "orders.expire", {"driver": "sync"}, delay=1.0)
            raise psycopg.Rollback
        with conn.transaction():
            committed = enqueue_sync(conn, "orders.expire", {"driver": "sync"}, delay=1.0)
    return committed, rolled_back


async def committed_and_rolled_back_async(database_url: str) -> tuple[EnqueuedJob, EnqueuedJob]:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            rolled_back = await enqueue(conn, "orders.expire", {"driver": "async"}, delay=1.0)
            raise psycopg.Rollback
        async with conn.transaction():
            committed = await enqueue(conn, "orders.expire", {"driver": "async"}, delay=1.0)
    return committed, rolled_back


@pytest.mark.parametrize("driver", ["sync", "async"])
async def test_on_psycopg_only_the_committed_transactions_job_is_published(
    node: DispatcherProcess, collector: Collector, database_url: str, driver: str
) -> None:
    if driver == "sync":  # in a thread, as a Django or Flask worker runs it
        committed, rolled_back = await asyncio.to_thread(
            committed_and_rolled_back_sync, database_url
        )
    else:
        committed, rolled_back = await committed_and_rolled_back_async(database_url)
    assert await collector.wait_for([committed.id], 30) == set()
    [delivery] = collector.deliveries[committed.id]
    assert orjson.loads(delivery.body) == {"driver": driver}
    assert delivery.received_at >= committed.run_at.timestamp()
    remaining = rolled_back.run_at.timestamp() + 5.0 - time.time()
    await asyncio.sleep(max(remaining, 0))  # well past the rolled-back job's due time
    await collector.settle()
    assert set(collector.deliveries) == {committed.id}
    assert node.is_running()
