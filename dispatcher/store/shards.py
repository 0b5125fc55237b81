"""Shard epochs: created once, bumped by whoever takes a shard; claims check them (CLAIM_JOBS)."""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher import errors
from dispatcher.store.db import Database
from dispatcher.store.queries import shards as queries


class ShardStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def ensure(self, shard_count: int) -> None:
        """Create the epoch rows; refuse a shard count other than the one the database has."""
        async with self._db.connection() as connection, connection.transaction():
            existing = await connection.fetchval(queries.COUNT_SHARDS)
            if existing and existing != shard_count:
                raise errors.ShardCountMismatch(
                    f"this database has {existing} shards; the configuration says {shard_count}"
                )
            await connection.execute(queries.ENSURE_SHARDS, shard_count)

    async def bump(self, shards: Sequence[int], owner: str) -> dict[int, int]:
        """Take shards: returns their new epochs, which fence every older claim."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.BUMP_EPOCHS, list(shards), owner)
        return {row["shard"]: row["epoch"] for row in rows}

    async def epochs(self) -> list[tuple[int, int, str | None]]:
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.SELECT_EPOCHS)
        return [(row["shard"], row["epoch"], row["owner"]) for row in rows]
