"""What production PostgreSQL servers raise, thrown at a dispatcher process while it fires: its
statements cancelled (57014), its backends terminated (57P01), every connection slot taken by
another client (53300), the database read-only for a while (25006, as a standby after a failover).
The node never exits, and every job answered 2xx is delivered once the fault ends."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from devstack.ports import reserve_port
from devstack.postgres import PostgresServer
from devstack.spread import schedule_spread
from tests.support.recovery import assert_serving_again

pytestmark = pytest.mark.faults

FAULT_S = 3.0
MAX_SLOTS = 1000  # the test server allows 300
OTHERS = "datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
CANCEL = f"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE {OTHERS}"
TERMINATE = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {OTHERS}"


@contextlib.asynccontextmanager
async def admin(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(dsn, timeout=10)
    try:
        yield connection
    finally:
        await connection.close(timeout=10)


async def repeatedly(dsn: str, database: str, statement: str, every_s: float) -> None:
    """Run ``statement`` against the dispatcher's backends every ``every_s`` for FAULT_S."""
    async with admin(dsn) as connection:
        end = time.monotonic() + FAULT_S
        while time.monotonic() < end:
            await connection.execute(statement, database)
            await asyncio.sleep(every_s)


async def cancel_statements(dsn: str, database: str) -> None:
    """Cancel whatever the dispatcher's backends are running, every 20 ms."""
    await repeatedly(dsn, database, CANCEL, 0.02)


async def terminate_backends(dsn: str, database: str) -> None:
    """Terminate every backend of the dispatcher, every 300 ms."""
    await repeatedly(dsn, database, TERMINATE, 0.3)


async def exhaust_connections(dsn: str, database: str) -> None:
    """Another client takes every connection slot (after the dispatcher's were cut, so it must
    open new ones), holds them, then lets go."""
    held: list[asyncpg.Connection] = []
    async with admin(dsn) as connection:
        await connection.execute(TERMINATE, database)
    try:
        for _ in range(MAX_SLOTS):
            try:
                held.append(await asyncpg.connect(dsn, timeout=10))
            except asyncpg.TooManyConnectionsError:
                break
        else:
            pytest.fail(f"PostgreSQL took more than {MAX_SLOTS} connections")
        assert len(held) > 10
        await asyncio.sleep(FAULT_S)
    finally:
        for connection in held:
            connection.terminate()  # no goodbye round trip per connection


async def read_only_for_a_while(dsn: str, database: str) -> None:
    """New sessions of the database are read-only (and the dispatcher's are cut, so its next ones
    are); afterwards the setting is lifted and nothing else is done: the dispatcher itself must
    drop the read-only sessions it holds."""
    async with admin(dsn) as connection:
        await connection.execute(
            f'ALTER DATABASE "{database}" SET default_transaction_read_only = on'
        )
        await connection.execute(TERMINATE, database)
        await asyncio.sleep(FAULT_S)
        await connection.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')


FAULTS: dict[str, Callable[[str, str], Awaitable[None]]] = {
    "statements cancelled": cancel_statements,
    "backends terminated": terminate_backends,
    "connections exhausted": exhaust_connections,
    "database read-only": read_only_for_a_while,
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_database_fault_during_firing_stops_nothing_and_loses_nothing(
    tmp_path: Path,
    pg_server: PostgresServer,
    database_url: str,
    amqp_url: str,
    collector: Collector,
    fault: str,
) -> None:
    database = urlsplit(database_url).path.lstrip("/")
    process = DispatcherProcess(
        tmp_path,
        port=reserve_port(),
        env={
            "DISPATCHER_DATABASE_URL": database_url,
            "DISPATCHER_AMQP_URL": amqp_url,
            "DISPATCHER_DB_POOL_MIN": "1",
            **FAST_LEASE,
        },
    )
    process.start()
    try:
        firing = await schedule_spread(process.url, 1500, over_s=8, batch=500)
        await asyncio.sleep(1.5)  # firing is under way
        await FAULTS[fault](pg_server.dsn(), database)
        ledger = await collector.reckon(firing, deadline_s=60, quiet_s=1.5)
        print(f"\n{fault} for {FAULT_S:.0f}s: {ledger}")
        assert process.is_running(), process.logs(80)
        assert ledger.lost == []
        assert ledger.early == []
        await assert_serving_again(process.url, collector)
    finally:
        print(process.logs(60))
        process.stop()
