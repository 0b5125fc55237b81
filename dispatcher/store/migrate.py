"""Applies ``sql/*.sql`` in name order under an advisory lock; each file once, recorded in a table.

The files ship inside the package (``dispatcher/sql``), so an installed wheel migrates too.
"""

from __future__ import annotations

import contextlib
import logging
from importlib import resources

import asyncpg

from dispatcher import errors
from dispatcher.store import db, queries

logger = logging.getLogger(__name__)


def migration_files() -> list[tuple[str, str]]:
    """(version, sql) for every migration shipped with the package, in order."""
    folder = resources.files("dispatcher") / "sql"
    files = sorted(
        (entry for entry in folder.iterdir() if entry.name.endswith(".sql")),
        key=lambda entry: entry.name,
    )
    return [(entry.name.removesuffix(".sql"), entry.read_text("utf-8")) for entry in files]


async def apply_migrations(dsn: str) -> list[str]:
    """Apply what is missing; returns the versions applied by this call (empty when up to date)."""
    with db.translated():  # a database not there yet is retried by the caller
        try:
            connection = await asyncpg.connect(dsn)
        except asyncpg.PostgresError as exc:
            if db.is_unavailable(exc):
                raise
            raise errors.MigrationError(f"cannot connect to PostgreSQL: {exc}") from exc
    try:
        await connection.execute(queries.MIGRATION_LOCK)
        try:
            await connection.execute(queries.CREATE_MIGRATIONS_TABLE)
            done = {row["version"] for row in await connection.fetch(queries.APPLIED_MIGRATIONS)}
            applied: list[str] = []
            for version, sql in migration_files():
                if version in done:
                    continue
                async with connection.transaction():
                    await connection.execute(sql)
                    await connection.execute(queries.RECORD_MIGRATION, version)
                logger.info("applied migration %s", version, extra={"action": "migrate"})
                applied.append(version)
            return applied
        finally:
            await connection.execute(queries.MIGRATION_UNLOCK)
    except asyncpg.PostgresError as exc:
        if db.is_unavailable(exc):
            raise errors.StoreUnavailable(f"migrations interrupted: {exc!r}") from exc
        raise errors.MigrationError(f"migration failed: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
