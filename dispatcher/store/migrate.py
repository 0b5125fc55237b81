"""Applies the shipped migrations in name order under an advisory lock; each once, with a checksum.

The files live in the repository's top-level ``sql/`` folder; the wheel carries them as
``dispatcher/sql`` (the build maps the folder in), and a source checkout or editable install reads
``sql/`` itself.

A database is only migrated forward from a state this release recognises: the versions applied
must be the first ones it ships, each with the checksum of the file it ships. Anything else (a
newer release's migration, one skipped, a file edited after it ran) stops the node with a message
naming the files, before any statement runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import asyncpg

from dispatcher import errors
from dispatcher.store import db, servers
from dispatcher.store.queries import migrate as queries

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0  # each host's; asyncpg's default


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    version: str  # the file name without ``.sql``
    sql: str
    checksum: str  # sha256 of the file's text, hex


@dataclass(frozen=True, slots=True, kw_only=True)
class Applied:
    version: str
    checksum: str | None  # None: recorded by a release that kept no checksums
    applied_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    version: str
    # applied | pending | skipped (pending, but a later one is applied) | changed (the file
    # differs from what was applied) | not shipped (applied by another release)
    state: str
    applied_at: datetime | None


def _folder() -> Traversable:
    shipped = resources.files("dispatcher") / "sql"
    if shipped.is_dir():  # an installed wheel
        return shipped
    return Path(__file__).resolve().parents[2] / "sql"  # the repository itself


def checksum(sql: str) -> str:
    return hashlib.sha256(sql.encode()).hexdigest()


# Beside the migrations, the schema they build, for reading: not run, kept equal to them by
# tests/integration/test_schema_file.py.
SCHEMA_FILE = "schema.sql"


def migration_files() -> list[Migration]:
    """Every migration shipped with this release, in order."""
    files = sorted(
        (
            entry
            for entry in _folder().iterdir()
            if entry.name.endswith(".sql") and entry.name != SCHEMA_FILE
        ),
        key=lambda entry: entry.name,
    )
    migrations = []
    for entry in files:
        sql = entry.read_text("utf-8")
        migrations.append(
            Migration(version=entry.name.removesuffix(".sql"), sql=sql, checksum=checksum(sql))
        )
    return migrations


def conflicts(shipped: Sequence[Migration], applied: Sequence[Applied]) -> list[str]:
    """Why this release must not run on a database with ``applied`` (empty: it may)."""
    files = {migration.version: migration for migration in shipped}
    done = {row.version: row for row in applied}
    problems = [
        f"{version}.sql is applied but not shipped by this release "
        "(was the database migrated by a newer release?)"
        for version in sorted(done.keys() - files.keys())
    ]
    last_applied = _last_applied(shipped, done.keys())
    problems += [
        f"{migration.version}.sql is not applied but a later migration is "
        f"({shipped[last_applied].version}.sql): migrations were applied out of order"
        for migration in shipped[: last_applied + 1]
        if migration.version not in done
    ]
    problems += [
        f"{row.version}.sql changed after it was applied (checksum {row.checksum[:12]}, "
        f"the shipped file's {files[row.version].checksum[:12]})"
        for row in applied
        if row.checksum is not None
        and row.version in files
        and row.checksum != files[row.version].checksum
    ]
    return problems


def _last_applied(shipped: Sequence[Migration], done: AbstractSet[str]) -> int:
    """The index of the last shipped migration applied (-1: none)."""
    return max((i for i, m in enumerate(shipped) if m.version in done), default=-1)


def status(shipped: Sequence[Migration], applied: Sequence[Applied]) -> list[Status]:
    """One line per shipped or applied migration, in name order."""
    files = {migration.version: migration for migration in shipped}
    done = {row.version: row for row in applied}
    skipped = {m.version for m in shipped[: _last_applied(shipped, done.keys()) + 1]} - done.keys()
    lines = []
    for version in sorted(files.keys() | done.keys()):
        row = done.get(version)
        if row is None:
            state = "skipped" if version in skipped else "pending"
        elif version not in files:
            state = "not shipped"
        elif row.checksum is not None and row.checksum != files[version].checksum:
            state = "changed"
        else:
            state = "applied"
        lines.append(
            Status(version=version, state=state, applied_at=row.applied_at if row else None)
        )
    return lines


async def _applied(connection: asyncpg.Connection) -> list[Applied]:
    if not await connection.fetchval(queries.MIGRATIONS_TABLE_EXISTS):
        return []
    rows = await connection.fetch(queries.APPLIED_MIGRATIONS)
    return [
        Applied(version=row["version"], checksum=row["checksum"], applied_at=row["applied_at"])
        for row in rows
    ]


def _refuse(problems: list[str]) -> errors.MigrationError:
    return errors.MigrationError(
        "this release does not match the database's migrations: "
        + "; ".join(problems)
        + " (see `dispatcher migrate --status`)"
    )


@contextlib.asynccontextmanager
async def _connected(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection with PostgreSQL's errors translated (unavailable: transient; else fatal)."""
    with db.translated():  # a database not there yet is retried by the caller
        try:
            connection = await servers.connect(dsn, timeout=CONNECT_TIMEOUT_S)
        except asyncpg.PostgresError as exc:
            if db.is_unavailable(exc):
                raise
            raise errors.MigrationError(f"cannot connect to PostgreSQL: {exc}") from exc
    try:
        yield connection
    except asyncpg.PostgresError as exc:
        if db.is_unavailable(exc):
            raise errors.StoreUnavailable(f"migrations interrupted: {exc!r}") from exc
        raise errors.MigrationError(f"migration failed: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def apply_migrations(dsn: str) -> list[str]:
    """Apply what is missing; returns the versions applied by this call (empty when up to date).

    Raises MigrationError, before applying anything, when the database's migrations are not a
    prefix of the shipped ones (``conflicts``)."""
    shipped = migration_files()
    async with _connected(dsn) as connection:
        await connection.execute(queries.MIGRATION_LOCK)
        try:
            await connection.execute(queries.CREATE_MIGRATIONS_TABLE)
            return await _apply(connection, shipped)
        finally:
            await connection.execute(queries.MIGRATION_UNLOCK)


async def _apply(connection: asyncpg.Connection, shipped: list[Migration]) -> list[str]:
    applied = await _applied(connection)
    problems = conflicts(shipped, applied)
    if problems:
        raise _refuse(problems)
    done = {row.version for row in applied}
    await connection.execute(  # checksums of versions recorded before they were kept
        queries.ADOPT_MIGRATION_CHECKSUMS,
        [m.version for m in shipped],
        [m.checksum for m in shipped],
    )
    versions: list[str] = []
    for migration in shipped:
        if migration.version in done:
            continue
        async with connection.transaction():
            await connection.execute(migration.sql)
            await connection.execute(
                queries.RECORD_MIGRATION, migration.version, migration.checksum
            )
        logger.info("applied migration %s", migration.version, extra={"action": "migrate"})
        versions.append(migration.version)
    return versions


async def read_status(dsn: str) -> list[Status]:
    """Every shipped and applied migration with its state; changes nothing."""
    async with _connected(dsn) as connection:
        applied = await _applied(connection)
    return status(migration_files(), applied)


async def check(dsn: str) -> None:
    """Raise MigrationError as ``apply_migrations`` would, changing nothing (for a node that does
    not migrate its database itself); pending migrations are only logged."""
    shipped = migration_files()
    async with _connected(dsn) as connection:
        applied = await _applied(connection)
    problems = conflicts(shipped, applied)
    if problems:
        raise _refuse(problems)
    done = {row.version for row in applied}
    pending = [m.version for m in shipped if m.version not in done]
    if pending:
        logger.warning(
            "%d migrations not applied (%s): run `dispatcher migrate`",
            len(pending),
            ", ".join(pending),
            extra={"action": "migrate"},
        )
