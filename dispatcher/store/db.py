"""The asyncpg pool: its lifecycle, and the translation of driver failures into StoreUnavailable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from dispatcher import errors
from dispatcher.store import queries

# Failures that mean "the database is not there right now", as opposed to a bug in a query.
_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.InterfaceError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    # Transient too: a submission locking its prerequisites and a batch of events finishing them
    # may, rarely, lock rows in opposite orders; PostgreSQL aborts one, which is retried.
    asyncpg.DeadlockDetectedError,
)


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Nothing to reset: the service sets no session state (no SET, LISTEN or advisory lock on
    pooled connections). asyncpg's default reset costs a round trip on every release; an open
    transaction is still rolled back by the pool before this runs."""


class Database:
    """Owns one pool. ``open``/``close`` are safe to call twice."""

    def __init__(self, dsn: str, *, min_size: int, max_size: int, timeout_s: float) -> None:
        self._dsn = dsn
        self._min_size = min_size
        self._max_size = max_size
        self.timeout_s = timeout_s
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._min_size,
                max_size=self._max_size,
                timeout=self.timeout_s,  # connect timeout: a dead server answers 503, not a hang
                max_inactive_connection_lifetime=60.0,
                reset=_keep_session,
            )
        except _UNAVAILABLE as exc:
            raise errors.StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @asynccontextmanager
    async def connection(
        self, timeout_s: float | None = None
    ) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        """A pooled connection; the whole block is bounded by ``timeout_s`` (default: the pool)."""
        if self._pool is None:
            raise errors.StoreUnavailable("the database pool is not open")
        try:
            async with asyncio.timeout(timeout_s or self.timeout_s):
                async with self._pool.acquire() as connection:
                    yield connection
        except _UNAVAILABLE as exc:
            raise errors.StoreUnavailable(f"PostgreSQL unavailable: {exc!r}") from exc

    async def dedicated(self) -> asyncpg.Connection:
        """A connection outside the pool, for session state the pool must not see (LISTEN)."""
        try:
            return await asyncpg.connect(self._dsn, timeout=self.timeout_s)
        except _UNAVAILABLE as exc:
            raise errors.StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc

    async def ping(self) -> bool:
        try:
            async with self.connection() as connection:
                await connection.fetchval(queries.PING)
        except errors.StoreUnavailable:
            return False
        return True
