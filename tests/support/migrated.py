"""A database migrated to just before one migration and filled the way a bulk load is: the
table's indexes dropped, the rows written, the indexes built again (a fraction of the time of
filling it indexed). For the tests that apply a migration to a million rows."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg

from dispatcher.store import migrate
from dispatcher.store.queries import migrate as queries

# The constraints that own an index (primary key, unique) no foreign key depends on, and every
# other index of a table.
_CONSTRAINTS = """
SELECT c.conname, pg_get_constraintdef(c.oid) AS definition FROM pg_constraint c
WHERE c.conrelid = $1::regclass AND c.contype IN ('p', 'u') AND NOT EXISTS (
    SELECT FROM pg_constraint f WHERE f.contype = 'f' AND f.conindid = c.conindid)
"""
_INDEXES = """
SELECT i.indexname, i.indexdef FROM pg_indexes i
WHERE i.tablename = $1 AND NOT EXISTS (
    SELECT FROM pg_constraint c WHERE c.conname = i.indexname AND c.conrelid = $1::regclass)
"""

Fill = Callable[[asyncpg.Connection], Awaitable[object]]


async def migrate_before(dsn: str, version: str, *, table: str, fill: Fill) -> None:
    """Every migration before ``version``, shards 0 and 1 at epoch 1, and ``table`` filled by
    ``fill`` with its indexes built after."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(queries.CREATE_MIGRATIONS_TABLE)
        for migration in migrate.migration_files():
            if migration.version >= version:
                break
            async with connection.transaction():
                await connection.execute(migration.sql)
                await connection.execute(
                    queries.RECORD_MIGRATION, migration.version, migration.checksum
                )
        await connection.execute("INSERT INTO shard_epochs (shard, epoch) VALUES (0, 1), (1, 1)")
        constraints = await connection.fetch(_CONSTRAINTS, table)
        indexes = await connection.fetch(_INDEXES, table)
        for constraint in constraints:
            await connection.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint[0]}"')
        for index in indexes:
            await connection.execute(f'DROP INDEX "{index[0]}"')
        await fill(connection)
        for constraint in constraints:
            await connection.execute(
                f'ALTER TABLE {table} ADD CONSTRAINT "{constraint[0]}" {constraint[1]}'
            )
        for index in indexes:
            await connection.execute(index[1])
    finally:
        await connection.close()
