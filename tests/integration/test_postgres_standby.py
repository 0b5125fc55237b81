"""The local primary with a synchronous standby, and a client of both hosts across a failover:
what a commit returned on the primary is on the standby after kill -9 and promote, and the
store's pool reaches the promoted server by itself."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import pytest

from devstack.postgres import PostgresServer
from devstack.postgres_standby import PrimaryWithStandby
from dispatcher import errors
from dispatcher.store.db import Database
from dispatcher.store.queries import connection as queries
from tests.support.waiting import until


def test_a_row_committed_on_the_primary_survives_its_kill_and_the_promotion(
    pg_pair: PrimaryWithStandby,
) -> None:
    assert pg_pair.sync_state() == "sync"
    marker = uuid.uuid4().hex
    pg_pair.primary.sql("CREATE TABLE survivors (marker text)", "dispatcher")
    pg_pair.primary.sql(f"INSERT INTO survivors VALUES ('{marker}')", "dispatcher")
    pg_pair.fail_over()
    assert not pg_pair.primary.is_running()
    assert pg_pair.standby.sql("SELECT pg_is_in_recovery()", "dispatcher").strip() == "f"
    assert pg_pair.standby.sql("SELECT marker FROM survivors", "dispatcher").strip() == marker


async def test_the_pool_moves_to_the_promoted_standby_and_the_switch_is_transient(
    pg_pair: PrimaryWithStandby,
) -> None:
    # The standby first: a client must pass it over while it is a standby.
    url = (
        f"postgresql://postgres@127.0.0.1:{pg_pair.standby.port},"
        f"127.0.0.1:{pg_pair.primary.port}/dispatcher"
    )
    database = Database(url, min_size=1, max_size=2, timeout_s=5)
    await database.open()
    try:
        async with database.connection() as connection:
            assert await connection.fetchval("SELECT pg_is_in_recovery()") is False
            assert await connection.fetchval("SHOW port") == str(pg_pair.primary.port)
        await asyncio.to_thread(pg_pair.kill_primary)
        # No primary: the standby is refused, and that is "unavailable", not a bug.
        with pytest.raises(errors.StoreUnavailable):
            async with database.connection() as connection:
                await connection.fetchval(queries.PING)
        assert not await database.ping()
        await asyncio.to_thread(pg_pair.promote)
        await until(database.ping, 30)
        async with database.connection() as connection:
            assert await connection.fetchval("SHOW port") == str(pg_pair.standby.port)
            assert await connection.fetchval("SELECT pg_is_in_recovery()") is False
    finally:
        await database.close()


async def test_a_host_that_never_answers_costs_one_timeout_then_the_next_host_serves(
    pg_server: PostgresServer,
) -> None:
    # A server whose machine is gone answers nothing: here a socket that takes connections
    # into its backlog and never speaks.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        url = f"postgresql://postgres@127.0.0.1:{port},127.0.0.1:{pg_server.port}/postgres"
        database = Database(url, min_size=1, max_size=1, timeout_s=2)
        started = time.monotonic()
        await database.open()
        try:
            async with database.connection(timeout_s=30) as connection:
                assert await connection.fetchval("SHOW port") == str(pg_server.port)
            assert time.monotonic() - started >= 2  # the silent host had its timeout
        finally:
            await database.close()
