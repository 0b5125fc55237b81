"""Running ``enqueue``'s statements on the caller's own connection, whichever PostgreSQL driver
made it: asyncpg (a connection or a pool's), psycopg 3 async or psycopg 3 sync (what Django 4.2+
holds under ``connection.connection``).

The statements are written once, with PostgreSQL's own ``$n`` placeholders: asyncpg takes them,
and so do psycopg's raw cursors. A driver is told by the connection's type among the modules
already imported (a connection of a driver never imported cannot exist), so an application
installs and imports only the driver it uses. Driver errors pass through unchanged: the caller
reads their ``sqlstate``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import asyncpg
    import psycopg
    from asyncpg.pool import PoolConnectionProxy

    AsyncConnection: TypeAlias = (
        asyncpg.Connection | PoolConnectionProxy | psycopg.AsyncConnection[Any]
    )
    SyncConnection: TypeAlias = psycopg.Connection[Any]

Row: TypeAlias = tuple[Any, ...]
INSTALL = "pip install 'delay-dispatcher-sdk[asyncpg]' or 'delay-dispatcher-sdk[psycopg]'"


async def fetch_row(conn: AsyncConnection, sql: str, arguments: Sequence[object]) -> Row | None:
    """The first row ``sql`` returns on an asyncpg or psycopg async connection, or None."""
    if "asyncpg" in sys.modules:
        import asyncpg
        from asyncpg.pool import PoolConnectionProxy

        if isinstance(conn, asyncpg.Connection | PoolConnectionProxy):
            record = await conn.fetchrow(sql, *arguments)
            return None if record is None else tuple(record)
    if "psycopg" in sys.modules:
        import psycopg
        from psycopg.rows import tuple_row

        if isinstance(conn, psycopg.AsyncConnection):
            async with psycopg.AsyncRawCursor(conn, row_factory=tuple_row) as cursor:
                await cursor.execute(sql, arguments)
                return await cursor.fetchone()
        if isinstance(conn, psycopg.Connection):  # its calls would block the event loop
            raise TypeError("conn is a synchronous psycopg.Connection: call enqueue_sync()")
    raise TypeError(f"conn must be an asyncpg or psycopg connection ({INSTALL}), not {_kind(conn)}")


def fetch_row_sync(conn: SyncConnection, sql: str, arguments: Sequence[object]) -> Row | None:
    """The first row ``sql`` returns on a psycopg (sync) connection, or None."""
    if "psycopg" in sys.modules:
        import psycopg
        from psycopg.rows import tuple_row

        if isinstance(conn, psycopg.Connection):
            with psycopg.RawCursor(conn, row_factory=tuple_row) as cursor:
                cursor.execute(sql, arguments)
                return cursor.fetchone()
    raise TypeError(
        f"conn must be a psycopg.Connection ('delay-dispatcher-sdk[psycopg]'), not {_kind(conn)}"
        " (an asynchronous connection takes enqueue())"
    )


def _kind(conn: object) -> str:
    kind = type(conn)
    return f"{kind.__module__}.{kind.__qualname__}"
