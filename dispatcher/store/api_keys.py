"""KeyStore: API keys in PostgreSQL, kept as token hashes. The only code that runs SQL on keys."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import asyncpg

from dispatcher import errors
from dispatcher.auth import api_keys
from dispatcher.store.db import Database
from dispatcher.store.queries import api_keys as queries


def key_from_row(row: asyncpg.Record) -> api_keys.ApiKey:
    return api_keys.ApiKey(
        id=row["id"],
        name=row["name"],
        scope=api_keys.Scope(row["scope"]),
        namespace=row["namespace"],
        routing_key_prefixes=tuple(row["routing_key_prefixes"]),
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
    )


class KeyStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        try:
            async with self._db.connection() as connection:
                yield connection
        except asyncpg.UndefinedTableError as exc:
            # `dispatcher keys` may run before any node migrated this database.
            raise errors.MigrationError(
                "no api_keys table: run 'dispatcher migrate' first"
            ) from exc

    async def create(
        self,
        *,
        scope: api_keys.Scope,
        namespace: str | None = None,
        routing_key_prefixes: Sequence[str] = (),
        name: str = "",
    ) -> tuple[api_keys.ApiKey, str]:
        """A new key and its token: the token exists only in this return value."""
        namespace, prefixes = api_keys.check_grant(scope, namespace, routing_key_prefixes)
        token = api_keys.new_token()
        async with self._connection() as connection:
            row = await connection.fetchrow(
                queries.INSERT_API_KEY,
                api_keys.digest(token),
                name,
                scope.value,
                namespace,
                list(prefixes),
            )
        assert row is not None  # INSERT ... RETURNING always returns the row
        return key_from_row(row), token

    async def find(self, token_digest: bytes) -> api_keys.ApiKey | None:
        """The live key with this token hash."""
        async with self._connection() as connection:
            row = await connection.fetchrow(queries.SELECT_API_KEY, token_digest)
        return None if row is None else key_from_row(row)

    async def list(self) -> list[api_keys.ApiKey]:
        async with self._connection() as connection:
            rows = await connection.fetch(queries.LIST_API_KEYS)
        return [key_from_row(row) for row in rows]

    async def revoke(self, key_id: int) -> bool:
        """False when there is no such live key."""
        async with self._connection() as connection:
            revoked = await connection.fetchval(queries.REVOKE_API_KEY, key_id)
        return revoked is not None

    async def live(self) -> tuple[dict[bytes, api_keys.ApiKey], bool]:
        """Every live key by its token hash, and whether a key was ever created (revoked ones
        count: auth stays on), read in one transaction."""
        async with self._connection() as connection, connection.transaction(readonly=True):
            rows = await connection.fetch(queries.LIVE_API_KEYS)
            ever = bool(rows) or bool(await connection.fetchval(queries.ANY_API_KEY))
        return {bytes(row["token_sha256"]): key_from_row(row) for row in rows}, ever

    async def any(self) -> bool:
        """Whether a key was ever created: auth stays on from then on, even once all are revoked."""
        async with self._connection() as connection:
            return bool(await connection.fetchval(queries.ANY_API_KEY))
