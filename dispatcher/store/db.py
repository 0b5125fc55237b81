"""The asyncpg pool: its lifecycle, and the translation of driver failures into StoreUnavailable."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import asyncpg

from dispatcher import errors
from dispatcher.store import servers
from dispatcher.store.queries import connection as queries

# Failures that mean "the database is not there right now", as opposed to a bug in a query.
_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,  # the connection was closed under the query
    # The driver's own bookkeeping of a connection went wrong (seen: "cannot switch to state 12;
    # another operation is in progress" after its session was terminated): another connection
    # will do, and this one is closed (``Database.connection``). Also its subclass
    # TargetServerAttributeNotMatched: no host of a multi-host URL accepts writes yet (the
    # primary died and no standby is promoted so far).
    asyncpg.InternalClientError,
)

# How long giving a connection back to the pool may take (see ``Database.connection``).
RELEASE_S = 1.0

# PostgreSQL's error classes (SQLSTATE's first two characters) that heal by themselves: a retry
# later can succeed with the same statement. 08 connection exceptions; 40 serialization failures
# and deadlocks (a submission locking its prerequisites and a batch of events finishing them may
# lock rows in opposite orders); 53 insufficient resources (too many connections, disk full, out
# of memory); 57 operator intervention (a cancelled statement, an admin or crash shutdown, a
# server starting up); and 25006, a read-only transaction: a standby just after a failover.
TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57"})
TRANSIENT_STATES = frozenset({"25006"})


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot serve us now (retry later), not that a statement
    is wrong."""
    if isinstance(exc, _UNAVAILABLE):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        return state[:2] in TRANSIENT_CLASSES or state in TRANSIENT_STATES
    return False


@contextmanager
def translated() -> Iterator[None]:
    """Raise the database's transient failures inside the block as StoreUnavailable."""
    try:
        yield
    except Exception as exc:
        if is_unavailable(exc):
            raise errors.StoreUnavailable(f"PostgreSQL unavailable: {exc!r}") from exc
        raise


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Nothing to reset: the service sets no session state (no SET, LISTEN or advisory lock on
    pooled connections). asyncpg's default reset costs a round trip on every release; an open
    transaction is still rolled back by the pool before this runs."""


class Database:
    """Owns one pool. ``open``/``close`` are safe to call twice."""

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int,
        max_size: int,
        timeout_s: float,
        dead_connection_s: float | None = None,
    ) -> None:
        """DEAD_CONNECTION_S: a connection whose data goes unacknowledged this long, or that is
        silent and unanswering, is dropped by the kernel (``servers.keep_alive``); None: the
        system's defaults (minutes)."""
        self._dsn = dsn
        self._dead_connection_s = dead_connection_s
        self._min_size = min_size
        self._max_size = max_size
        self.timeout_s = timeout_s
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        if self._pool is not None:
            return
        with translated():
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._min_size,
                max_size=self._max_size,
                timeout=self.timeout_s,  # connect timeout: a dead server answers 503, not a hang
                # Each host of a multi-host URL within that timeout, its socket kept alive.
                connect=functools.partial(servers.connect, dead_s=self._dead_connection_s),
                max_inactive_connection_lifetime=60.0,
                reset=_keep_session,
            )

    async def close(self) -> None:
        """Close every connection; one still held when the node stops is cut (``terminate``)
        rather than waited for."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await pool.close()
        except asyncio.CancelledError:
            pool.terminate()
            raise

    @asynccontextmanager
    async def connection(
        self, timeout_s: float | None = None
    ) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        """A pooled connection; the whole block is bounded by ``timeout_s`` (default: the pool)."""
        if self._pool is None:
            raise errors.StoreUnavailable("the database pool is not open")
        pool = self._pool
        with translated():
            async with asyncio.timeout(timeout_s or self.timeout_s):
                connection = await pool.acquire()
                try:
                    yield connection
                except (asyncpg.ReadOnlySQLTransactionError, asyncpg.InternalClientError):
                    # A session of a demoted primary (or one opened while the database was
                    # read-only) stays read-only, and one the driver lost track of stays
                    # unusable: closed, so the pool opens a fresh one.
                    connection.terminate()
                    raise
                finally:
                    # A statement cut short by the timeout is cancelled through a connection of
                    # its own, which the release waits for: on a path that drops packets, for
                    # ever. Past RELEASE_S the connection is closed instead.
                    await pool.release(connection, timeout=RELEASE_S)

    async def dedicated(self, name: str = "") -> asyncpg.Connection:
        """A connection outside the pool, for session state the pool must not see (LISTEN);
        ``name`` is its application_name (what pg_stat_activity shows)."""
        settings = {"application_name": name} if name else None
        with translated():
            return await servers.connect(
                self._dsn,
                timeout=self.timeout_s,
                dead_s=self._dead_connection_s,
                server_settings=settings,
            )

    async def probe(self, timeout_s: float) -> str | None:
        """One round trip on a pooled connection within TIMEOUT_S: None, or why it failed."""
        try:
            async with self.connection(timeout_s) as connection:
                await connection.fetchval(queries.PING)
        except errors.StoreUnavailable as exc:
            return str(exc)
        return None

    async def ping(self) -> bool:
        return await self.probe(self.timeout_s) is None
