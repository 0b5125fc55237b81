"""Migrations against a real database: each applied once with its checksum, and a database this
release does not recognise (a newer or skipped migration, an edited file) is refused, with the
files named, before anything runs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest

from devstack.ports import reserve_port
from dispatcher import errors
from dispatcher.node import Node
from dispatcher.settings import Settings
from dispatcher.store import migrate

SHIPPED = migrate.migration_files()
LAST = SHIPPED[-1].version


@pytest.fixture
async def connection(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


async def recorded(connection: asyncpg.Connection) -> dict[str, str | None]:
    rows = await connection.fetch("SELECT version, checksum FROM schema_migrations")
    return {row["version"]: row["checksum"] for row in rows}


async def test_every_applied_migration_is_recorded_with_the_checksum_of_its_file(
    connection: asyncpg.Connection,
) -> None:
    assert await recorded(connection) == {m.version: m.checksum for m in SHIPPED}


async def test_a_changed_file_is_refused_before_anything_is_applied(
    database_url: str, connection: asyncpg.Connection
) -> None:
    await connection.execute("DELETE FROM schema_migrations WHERE version = $1", LAST)
    changed = SHIPPED[1].version
    await connection.execute(
        "UPDATE schema_migrations SET checksum = $2 WHERE version = $1", changed, "0" * 64
    )
    with pytest.raises(errors.MigrationError, match=f"{changed}.sql changed after it was applied"):
        await migrate.apply_migrations(database_url)
    assert LAST not in await recorded(connection)  # the pending one did not run either


async def test_a_skipped_migration_is_refused_and_shown(
    database_url: str, connection: asyncpg.Connection
) -> None:
    skipped = SHIPPED[2].version
    await connection.execute("DELETE FROM schema_migrations WHERE version = $1", skipped)
    with pytest.raises(errors.MigrationError, match=f"{skipped}.sql is not applied but a later"):
        await migrate.apply_migrations(database_url)
    states = {line.version: line.state for line in await migrate.read_status(database_url)}
    assert states[skipped] == "skipped"
    assert states[LAST] == "applied"


async def test_a_node_refuses_a_database_migrated_by_a_newer_release(
    database_url: str, connection: asyncpg.Connection
) -> None:
    newer = "9999_from_a_newer_release"
    await connection.execute(
        "INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2)", newer, "f" * 64
    )
    nowhere = f"amqp://guest:guest@127.0.0.1:{reserve_port()}/"
    for migrate_on_start in (True, False):
        settings = Settings(
            database_url=database_url,
            amqp_url=nowhere,
            shard_count=8,
            migrate_on_start=migrate_on_start,
        )
        with pytest.raises(errors.MigrationError, match=f"{newer}.sql is applied but not shipped"):
            await asyncio.wait_for(Node(settings).run(serve_http=False), 60)


async def test_versions_recorded_before_checksums_were_kept_adopt_the_shipped_ones(
    database_url: str, connection: asyncpg.Connection
) -> None:
    await connection.execute("ALTER TABLE schema_migrations DROP COLUMN checksum")
    lines = await migrate.read_status(database_url)  # reads the older table, changes nothing
    assert {line.state for line in lines} == {"applied"}
    columns = await connection.fetchval(
        "SELECT count(*) FROM information_schema.columns "
        "WHERE table_name = 'schema_migrations' AND column_name = 'checksum'"
    )
    assert columns == 0
    assert await migrate.apply_migrations(database_url) == []
    assert await recorded(connection) == {m.version: m.checksum for m in SHIPPED}


async def test_migrate_status_lists_every_migration_with_its_state(
    database_url: str, connection: asyncpg.Connection
) -> None:
    await connection.execute("DELETE FROM schema_migrations WHERE version = $1", LAST)
    env = {**os.environ, "DISPATCHER_DATABASE_URL": database_url}
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "dispatcher", "migrate", "--status"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [line[0] for line in lines] == [m.version for m in SHIPPED]
    assert [line[1] for line in lines] == ["applied"] * (len(SHIPPED) - 1) + ["pending"]
    assert LAST not in await recorded(connection)  # --status applied nothing


async def test_the_queue_tables_are_vacuumed_and_analysed_after_two_percent_changed(
    connection: asyncpg.Connection,
) -> None:
    rows = await connection.fetch(
        "SELECT relname, reloptions FROM pg_class WHERE relname IN ('jobs', 'event_batches')"
    )
    for row in rows:
        options = dict(option.split("=") for option in row["reloptions"])
        assert options["autovacuum_vacuum_scale_factor"] == "0.02", row["relname"]
        assert options["autovacuum_analyze_scale_factor"] == "0.02", row["relname"]
    assert len(rows) == 2
