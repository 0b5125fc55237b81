"""enqueue() against a real PostgreSQL: the job exists if and only if the caller's transaction
commits, and so does its wake-up notification."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from consumers_sdk import contract
from consumers_sdk import enqueue as enqueue_module
from consumers_sdk.enqueue import NoShards, enqueue
from dispatcher.store.jobs import job_from_row
from dispatcher.store.queries import shards as queries
from tests.support.due_listener import Listener, listening
from tests.support.faketime import FakeClock

SHARDS = 16


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    await connection.execute(queries.ENSURE_SHARDS, SHARDS)  # what a dispatcher's first start does
    await connection.execute("CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL)")
    yield connection
    await connection.close()


@pytest.fixture
async def listener(database_url: str) -> AsyncIterator[Listener]:
    async with listening(database_url) as listener:
        yield listener


async def jobs(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT * FROM jobs ORDER BY id")


async def test_a_committed_job_is_stored_and_notified_exactly_once(
    conn: asyncpg.Connection, listener: Listener
) -> None:
    async with conn.transaction():
        job = await enqueue(
            conn,
            "orders.expire",
            {"order": 1},
            delay=timedelta(seconds=30),
            headers={"tenant": "acme"},
            priority=3,
            ttl=timedelta(minutes=5),
            idempotency_key="order-1-expiry",
        )
        assert listener.payloads.empty()
        await asyncio.sleep(0.3)
        assert listener.payloads.empty()  # nothing before the commit
    assert job.created
    assert job.id == str(uuid.UUID(job.id))  # text in its canonical form, as JobRecord.id
    assert uuid.UUID(job.id).version == 7
    [row] = await jobs(conn)
    stored = job_from_row(row)
    assert str(stored.id) == job.id
    assert stored.state == "scheduled"
    assert 0 <= stored.shard < SHARDS
    assert stored.routing_key == "orders.expire"
    assert orjson.loads(stored.payload) == {"order": 1}
    assert stored.headers == {"tenant": "acme"}
    assert (stored.priority, stored.ttl_ms, stored.idempotency_key) == (
        3,
        300_000,
        "order-1-expiry",
    )
    assert stored.run_at == job.run_at
    assert abs((stored.run_at - datetime.now(UTC)).total_seconds() - 30) < 5
    [payload] = await listener.drained()
    job_id, shard, epoch_s, routing_key = payload.split(",")
    assert (job_id, int(shard), routing_key) == (job.id, stored.shard, "orders.expire")
    assert float(epoch_s) == pytest.approx(job.run_at.timestamp(), abs=1e-6)


async def test_a_rolled_back_job_leaves_no_row_and_no_notification(
    conn: asyncpg.Connection, listener: Listener
) -> None:
    transaction = conn.transaction()
    await transaction.start()
    job = await enqueue(conn, "orders.expire", {"order": 2})
    await conn.execute("INSERT INTO orders VALUES (2, 'placed')")
    await transaction.rollback()
    assert job.created
    assert await jobs(conn) == []
    assert await conn.fetchval("SELECT count(*) FROM orders") == 0
    assert await listener.drained() == []


async def test_the_job_commits_with_the_callers_own_rows_or_not_at_all(
    conn: asyncpg.Connection, listener: Listener
) -> None:
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (3, 'placed')")
        placed = await enqueue(
            conn, "orders.expire", {"order": 3}, delay=60, idempotency_key="order-3"
        )
    transaction = conn.transaction()
    await transaction.start()
    await enqueue(conn, "orders.expire", {"order": 3, "again": True}, delay=60)
    with pytest.raises(asyncpg.UniqueViolationError):
        await conn.execute("INSERT INTO orders VALUES (3, 'placed twice')")
    await transaction.rollback()
    assert [str(row["id"]) for row in await jobs(conn)] == [placed.id]
    assert await conn.fetchval("SELECT state FROM orders WHERE id = 3") == "placed"
    assert [payload.split(",")[0] for payload in await listener.drained()] == [placed.id]


async def test_outside_a_transaction_the_job_commits_by_itself(
    conn: asyncpg.Connection, listener: Listener
) -> None:
    job = await enqueue(conn, "orders.expire", [1, 2, 3], run_at=datetime(2000, 1, 1, tzinfo=UTC))
    [row] = await jobs(conn)
    assert str(row["id"]) == job.id
    assert row["run_at"] == datetime(2000, 1, 1, tzinfo=UTC)  # in the past: due now
    assert len(await listener.drained()) == 1


async def test_an_idempotency_key_seen_before_returns_the_stored_job(
    conn: asyncpg.Connection, listener: Listener
) -> None:
    first = await enqueue(conn, "orders.expire", {"n": 1}, delay=10, idempotency_key="k")
    async with conn.transaction():
        again = await enqueue(conn, "orders.expire", {"n": 2}, delay=99, idempotency_key="k")
    other_namespace = await enqueue(
        conn, "orders.expire", {"n": 3}, idempotency_key="k", namespace="billing"
    )
    assert (again.id, again.run_at, again.created) == (first.id, first.run_at, False)
    assert other_namespace.created
    assert other_namespace.id != first.id
    rows = await jobs(conn)
    assert [orjson.loads(row["payload"]) for row in rows] == [{"n": 1}, {"n": 3}]
    assert len(await listener.drained()) == 2  # the repeat woke nobody


async def test_the_retry_policy_is_stored_as_contract_headers(conn: asyncpg.Connection) -> None:
    await enqueue(
        conn,
        "orders.expire",
        {},
        headers={"tenant": "acme"},
        max_attempts=7,
        retry_backoff=[timedelta(seconds=1), 5, 30.5],
    )
    [row] = await jobs(conn)
    headers = job_from_row(row).headers
    assert headers == {"tenant": "acme", "x-retry-max-attempts": 7, "x-retry-backoff-s": "1,5,30.5"}
    assert contract.read_retry_policy(headers) == contract.RetryPolicy(
        max_attempts=7, backoff_s=(1.0, 5.0, 30.5)
    )


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"routing_key": "orders.*"}, ValueError, "routing_key"),
    ({"routing_key": "a" * 256}, ValueError, "routing_key"),
    ({"routing_key": b"orders"}, TypeError, "routing_key"),
    ({"payload": {"at": datetime.now(UTC)}}, TypeError, "payload"),
    ({"payload": 2**64}, TypeError, "payload"),
    ({"payload": "x" * 300_000}, ValueError, "payload"),
    ({"headers": {"x-job-id": "mine"}}, ValueError, "headers.x-job-id"),
    ({"headers": {"x-retry-max-attempts": 1}}, ValueError, "headers.x-retry-max-attempts"),
    ({"headers": {"tenant": [1]}}, ValueError, "headers.tenant"),
    ({"headers": {"tenant": float("nan")}}, ValueError, "headers.tenant"),
    ({"headers": {f"h{i}": i for i in range(33)}}, ValueError, "headers"),
    ({"delay": -1}, ValueError, "delay"),
    ({"delay": timedelta(days=4000)}, ValueError, "delay"),
    ({"delay": "soon"}, TypeError, "delay"),
    ({"delay": 1e20}, ValueError, "delay"),
    (
        {"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))},
        ValueError,
        "run_at",
    ),
    ({"delay": 1, "run_at": datetime.now(UTC)}, ValueError, "delay and run_at"),
    ({"run_at": datetime(2030, 1, 1)}, ValueError, "run_at"),
    ({"priority": 10}, ValueError, "priority"),
    ({"priority": True}, ValueError, "priority"),
    ({"ttl": 0}, ValueError, "ttl"),
    ({"idempotency_key": ""}, ValueError, "idempotency_key"),
    ({"idempotency_key": "k\x00"}, ValueError, "idempotency_key"),
    ({"namespace": ""}, ValueError, "namespace"),
    ({"max_attempts": 0}, ValueError, "max_attempts"),
    ({"max_attempts": 101}, ValueError, "max_attempts"),
    ({"retry_backoff": []}, ValueError, "retry_backoff"),
    ({"retry_backoff": [1, 3601]}, ValueError, "retry_backoff[1]"),
    ({"retry_backoff": "1,2"}, TypeError, "retry_backoff"),
    ({"dealy": 5}, TypeError, "dealy"),  # misspelt: refused, not dropped
]


@pytest.mark.parametrize(("change", "error", "argument"), BAD)
async def test_a_refused_job_raises_naming_the_argument_and_leaves_the_transaction_usable(
    conn: asyncpg.Connection,
    listener: Listener,
    change: dict[str, Any],
    error: type[Exception],
    argument: str,
) -> None:
    call: dict[str, Any] = {"routing_key": "orders.expire", "payload": {"ok": True}, **change}
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (9, 'placed')")
        with pytest.raises(error, match=rf"^{re.escape(argument)}[ :]") as raised:
            await enqueue(conn, call.pop("routing_key"), call.pop("payload"), **call)
        await conn.execute("UPDATE orders SET state = 'kept' WHERE id = 9")  # still usable
    assert argument in str(raised.value)
    assert await jobs(conn) == []
    assert await conn.fetchval("SELECT state FROM orders WHERE id = 9") == "kept"
    assert await listener.drained(0.2) == []


# Run under libfaketime: the caller's clock 20 s ahead, as a host whose NTP failed.
ENQUEUE_WITH_A_DELAY = """
import asyncio, sys
import asyncpg
from consumers_sdk.enqueue import enqueue

async def main() -> None:
    connection = await asyncpg.connect(sys.argv[1])
    try:
        job = await enqueue(connection, "clock.delay", {}, delay=30)
        print(job.run_at.timestamp())
    finally:
        await connection.close()

asyncio.run(main())
"""


async def test_a_delay_counts_from_postgresqls_clock_not_the_callers(
    conn: asyncpg.Connection, database_url: str, tmp_path: Path
) -> None:
    clock = FakeClock(tmp_path, "+20s")
    before = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
    enqueued = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", ENQUEUE_WITH_A_DELAY, database_url],
        env={**os.environ, **clock.env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    after = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
    run_at = float(enqueued.stdout.strip())
    (stored,) = await conn.fetchrow("SELECT extract(epoch FROM run_at)::float8 FROM jobs")
    assert stored == pytest.approx(run_at, abs=1e-6)
    assert before + 30 <= run_at <= after + 30  # not 20 s later, as the caller's clock says


async def test_a_database_no_dispatcher_ever_started_on_is_refused_clearly(
    database_url: str,
) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        with pytest.raises(NoShards, match="start a dispatcher"):
            await enqueue(connection, "orders.expire", {})
        assert await connection.fetchval("SELECT count(*) FROM jobs") == 0
    finally:
        await connection.close()


async def test_jobs_spread_over_every_shard(conn: asyncpg.Connection) -> None:
    async with conn.transaction():
        for n in range(200):
            await enqueue(conn, "orders.expire", n, delay=3600)
    shards = {row["shard"] for row in await jobs(conn)}
    assert shards == set(range(SHARDS))
    ids = [row["id"] for row in await jobs(conn)]
    assert all(isinstance(job_id, uuid.UUID) for job_id in ids)


async def test_enqueues_statements_prepare_against_the_migrated_schema(
    conn: asyncpg.Connection,
) -> None:
    # The SDK keeps its own SQL: a migration that breaks it fails here, not in an application.
    for sql in (enqueue_module.INSERT_JOB, enqueue_module.SELECT_BY_KEY):
        await conn.prepare(sql)


def test_the_sdk_side_imports_nothing_of_the_dispatcher_nor_a_driver_or_framework() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, consumers_sdk, consumers_sdk.enqueue, consumers_sdk.integrations.fastapi;"
            " print(' '.join(sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # Nor a driver or a framework: each is imported by the application that uses it.
    unwanted = ("dispatcher", "fastapi", "starlette", "kazoo", "asyncpg", "psycopg", "django")
    assert not [m for m in loaded if m.split(".")[0] in unwanted]
