"""enqueue() and enqueue_sync() on psycopg 3 (async and sync, Django's driver) against a real
PostgreSQL: the job commits or rolls back with the caller's transaction, and so does its due
notice; refusals and errors are the asyncpg path's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import orjson
import psycopg
import pytest

from consumers_sdk.enqueue import EnqueuedJob, NoShards, SchemaTooOld, enqueue, enqueue_sync
from devstack.postgres import PostgresServer
from dispatcher.store.queries import shards as queries
from tests.support.due_listener import Listener, listening

SHARDS = 16


@pytest.fixture
async def database(database_url: str) -> str:
    """The test's database as a dispatcher leaves it (shards made), with an application table."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(queries.ENSURE_SHARDS, SHARDS)
        await conn.execute("CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL)")
    finally:
        await conn.close()
    return database_url


@pytest.fixture
async def listener(database: str) -> AsyncIterator[Listener]:
    async with listening(database) as listener:
        yield listener


async def rows(database: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database)
    try:
        return await conn.fetch(sql)
    finally:
        await conn.close()


async def on_async_connection(database: str, order: int, *, commit: bool) -> EnqueuedJob:
    """An order placed with its expiry job on a psycopg AsyncConnection, committed or not."""
    async with await psycopg.AsyncConnection.connect(database) as conn, conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (%s, 'placed')", [order])
        job = await enqueue(conn, "orders.expire", {"order": order}, delay=30)
        if not commit:
            raise psycopg.Rollback
    return job


def placed_sync(database: str, order: int, *, commit: bool) -> EnqueuedJob:
    with psycopg.connect(database) as conn, conn.transaction():
        conn.execute("INSERT INTO orders VALUES (%s, 'placed')", [order])
        job = enqueue_sync(conn, "orders.expire", {"order": order}, delay=30)
        if not commit:
            raise psycopg.Rollback
    return job


async def on_sync_connection(database: str, order: int, *, commit: bool) -> EnqueuedJob:
    """The same on a psycopg (sync) Connection, in a thread as an application's worker runs it."""
    return await asyncio.to_thread(placed_sync, database, order, commit=commit)


Placing = Callable[..., Awaitable[EnqueuedJob]]
DRIVERS = pytest.mark.parametrize(
    "placing", [on_async_connection, on_sync_connection], ids=["async", "sync"]
)


@DRIVERS
async def test_a_committed_job_is_stored_with_the_callers_rows_and_notified_once(
    database: str, listener: Listener, placing: Placing
) -> None:
    job = await placing(database, 1, commit=True)
    assert job.created
    assert job.id == str(uuid.UUID(job.id))  # text, whatever the driver gives
    assert job.run_at.utcoffset() == timedelta(0)
    [row] = await rows(database, "SELECT * FROM jobs")
    assert (str(row["id"]), row["routing_key"], row["state"]) == (
        job.id,
        "orders.expire",
        "scheduled",
    )
    assert orjson.loads(row["payload"]) == {"order": 1}
    assert row["run_at"] == job.run_at
    assert [r["id"] for r in await rows(database, "SELECT id FROM orders")] == [1]
    [notice] = await listener.drained()
    assert notice.split(",")[0] == job.id


@DRIVERS
async def test_a_rolled_back_job_leaves_no_row_and_no_notice(
    database: str, listener: Listener, placing: Placing
) -> None:
    job = await placing(database, 2, commit=False)
    assert job.created
    assert await rows(database, "SELECT id FROM jobs") == []
    assert await rows(database, "SELECT id FROM orders") == []
    assert await listener.drained() == []


async def test_a_repeated_idempotency_key_returns_the_stored_job_in_utc(
    database: str, listener: Listener
) -> None:
    def twice() -> tuple[EnqueuedJob, EnqueuedJob]:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'America/New_York'")  # psycopg answers in this zone
            first = enqueue_sync(conn, "orders.expire", 1, delay=60, idempotency_key="order-9")
            again = enqueue_sync(conn, "orders.expire", 2, delay=5, idempotency_key="order-9")
        return first, again

    first, again = await asyncio.to_thread(twice)
    assert (first.created, again.created) == (True, False)
    assert (again.id, again.run_at) == (first.id, first.run_at)
    assert again.run_at.tzinfo == UTC
    assert len(await rows(database, "SELECT id FROM jobs")) == 1
    assert len(await listener.drained()) == 1  # the repeat woke nobody


async def test_a_refused_job_names_the_argument_and_leaves_the_transaction_usable(
    database: str, listener: Listener
) -> None:
    async with await psycopg.AsyncConnection.connect(database) as conn, conn.transaction():
        await conn.execute("INSERT INTO orders VALUES (3, 'placed')")
        with pytest.raises(ValueError, match=r"^priority must be an integer from 0 to 9"):
            await enqueue(conn, "orders.expire", {}, priority=10)
        await conn.execute("UPDATE orders SET state = 'kept' WHERE id = 3")  # still usable
    assert await rows(database, "SELECT id FROM jobs") == []
    assert [tuple(r) for r in await rows(database, "SELECT * FROM orders")] == [(3, "kept")]
    assert await listener.drained(0.2) == []


@pytest.fixture
def unmigrated(pg_server: PostgresServer) -> Iterator[str]:
    """A database no dispatcher ever migrated (no contract function)."""
    name = f"bare_{uuid.uuid4().hex}"
    pg_server.create_database(name)
    yield pg_server.dsn(name)
    pg_server.drop_database(name)


async def enqueue_on(driver: str, database: str) -> EnqueuedJob:
    if driver == "asyncpg":
        conn = await asyncpg.connect(database)
        try:
            return await enqueue(conn, "orders.expire", {})
        finally:
            await conn.close()
    if driver == "psycopg-async":
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as aconn:
            return await enqueue(aconn, "orders.expire", {})

    def run() -> EnqueuedJob:
        with psycopg.connect(database, autocommit=True) as conn:
            return enqueue_sync(conn, "orders.expire", {})

    return await asyncio.to_thread(run)


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg-async", "psycopg-sync"])
async def test_a_database_without_the_contract_function_raises_schema_too_old(
    unmigrated: str, driver: str
) -> None:
    with pytest.raises(SchemaTooOld, match="migrate it with a newer dispatcher"):
        await enqueue_on(driver, unmigrated)


@pytest.mark.parametrize("driver", ["psycopg-async", "psycopg-sync"])
async def test_a_database_without_shards_raises_no_shards(database_url: str, driver: str) -> None:
    with pytest.raises(NoShards, match="start a dispatcher"):
        await enqueue_on(driver, database_url)
    assert await rows(database_url, "SELECT id FROM jobs") == []


async def test_a_connection_of_the_wrong_kind_is_refused_naming_the_right_call(
    database: str,
) -> None:
    sync = await asyncio.to_thread(psycopg.connect, database)
    try:  # its calls would block the event loop
        with pytest.raises(TypeError, match="call enqueue_sync"):
            await enqueue(sync, "orders.expire", {})
    finally:
        await asyncio.to_thread(sync.close)
    conn = await asyncpg.connect(database)
    try:
        with pytest.raises(TypeError, match=r"psycopg\.Connection.*not asyncpg"):
            enqueue_sync(conn, "orders.expire", {})
    finally:
        await conn.close()
    with pytest.raises(TypeError, match=r"delay-dispatcher-sdk\[psycopg\]"):
        await enqueue(object(), "orders.expire", {})
    assert await rows(database, "SELECT id FROM jobs") == []


# Django's connection in a process of its own (settings are process-wide): an order and its job
# in transaction.atomic(), an exception that rolls a second one back, and a savepoint (a nested
# atomic) rolled back inside a committed block.
DJANGO_SCRIPT = """
import contextlib, json, os
import django
from django.conf import settings

settings.configure(
    DATABASES={"default": json.loads(os.environ["TEST_DATABASE"])},
    INSTALLED_APPS=["consumers_sdk.integrations.django"],
    USE_TZ=True,
)
django.setup()

from django.db import connection, transaction
from consumers_sdk.enqueue import enqueue_sync
from consumers_sdk.integrations.django import psycopg_connection


class Abort(Exception):
    pass


def place(order):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders VALUES (%s, 'placed')", [order])
    return enqueue_sync(psycopg_connection(), "orders.expire", {"order": order}, delay=30).id


with transaction.atomic():
    committed = place(1)
with contextlib.suppress(Abort), transaction.atomic():  # the exception leaves the block
    rolled_back = place(2)
    raise Abort
with transaction.atomic():
    outer = place(3)
    with contextlib.suppress(Abort), transaction.atomic():  # a savepoint, rolled back
        inner = place(4)
        raise Abort
print(json.dumps({"committed": committed, "rolled_back": rolled_back, "outer": outer,
                  "inner": inner}))
"""


def django_database(database: str) -> dict[str, Any]:
    url = urlsplit(database)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.path.lstrip("/"),
        "USER": url.username,
        "HOST": url.hostname,
        "PORT": str(url.port),
    }


async def test_django_atomic_blocks_commit_or_roll_back_the_job_with_their_rows(
    database: str, listener: Listener
) -> None:
    env = {**os.environ, "TEST_DATABASE": json.dumps(django_database(database))}
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", DJANGO_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    made = json.loads(ran.stdout)
    stored = [str(r["id"]) for r in await rows(database, "SELECT id FROM jobs ORDER BY id")]
    assert stored == [made["committed"], made["outer"]]
    assert [r["id"] for r in await rows(database, "SELECT id FROM orders ORDER BY id")] == [1, 3]
    notices = [payload.split(",")[0] for payload in await listener.drained()]
    assert sorted(notices) == sorted([made["committed"], made["outer"]])
