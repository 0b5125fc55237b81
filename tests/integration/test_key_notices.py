"""Key notices on a real PostgreSQL: creating or revoking a stored key counts at once on every
node, though each caches the answers for an hour here; a notice lost while a node's listener was
cut counts once it reconnects; and a cached answer is not used past its time while PostgreSQL is
down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import httpx
import pytest

from devstack.postgres import PostgresServer
from dispatcher.auth import api_keys
from dispatcher.node import Node
from dispatcher.store.api_keys import KeyStore
from tests.integration.test_auth import bearer, dispatcher_cli, wait_for_status
from tests.support.nodes import client, running_node
from tests.support.waiting import until

CACHE_S = 3600.0  # only a notice (or a reconnect) can explain a change seen within the deadline
AT_ONCE_S = 5.0  # generous for a loaded machine; far below the cache time
STATIC = "static-admin-token-0123456789"


@pytest.fixture
async def nodes(database_url: str, amqp_url: str) -> AsyncIterator[tuple[Node, Node]]:
    """Two keyless nodes on one database."""
    settings = {
        "database_url": database_url,
        "amqp_url": amqp_url,
        "shard_count": 4,
        "api_key_cache_s": CACHE_S,
    }
    async with (
        running_node(node_id="keys-a", **settings) as first,
        running_node(node_id="keys-b", **settings) as second,
    ):
        yield first, second


async def test_the_first_key_created_closes_the_api_on_every_node_at_once(
    nodes: tuple[Node, Node],
) -> None:
    first, second = nodes
    async with client(first) as http_a, client(second) as http_b:
        # Both answered "no key exists" and cached it for an hour.
        assert (await http_a.get("/v1/jobs")).status_code == 200
        assert (await http_b.get("/v1/jobs")).status_code == 200
        _, token = await KeyStore(first.core.db).create(scope=api_keys.Scope.PRODUCER)
        await wait_for_status(http_a, 401, {}, AT_ONCE_S)
        await wait_for_status(http_b, 401, {}, AT_ONCE_S)
        assert (await http_b.get("/v1/jobs", headers=bearer(token))).status_code == 200


async def test_a_revoked_key_is_refused_at_once_on_every_node(nodes: tuple[Node, Node]) -> None:
    first, second = nodes
    store = KeyStore(first.core.db)
    key, token = await store.create(scope=api_keys.Scope.PRODUCER)
    async with client(first) as http_a, client(second) as http_b:
        await wait_for_status(http_a, 200, bearer(token), AT_ONCE_S)  # cached as valid
        await wait_for_status(http_b, 200, bearer(token), AT_ONCE_S)
        assert await store.revoke(key.id)
        await wait_for_status(http_a, 401, bearer(token), AT_ONCE_S)
        await wait_for_status(http_b, 401, bearer(token), AT_ONCE_S)


async def test_a_key_revoked_by_the_command_is_refused_at_once(
    nodes: tuple[Node, Node], database_url: str
) -> None:
    first, _ = nodes
    key, token = await KeyStore(first.core.db).create(scope=api_keys.Scope.PRODUCER)
    async with client(first) as http:
        await wait_for_status(http, 200, bearer(token), AT_ONCE_S)
        code, out, err = await dispatcher_cli(database_url, "revoke", str(key.id))
        assert (code, out.strip()) == (0, f"revoked key {key.id}"), err
        await wait_for_status(http, 401, bearer(token), AT_ONCE_S)


@dataclass(frozen=True)
class CachedKey:
    """A stored key that ``node`` answered for and cached as valid, after the notice of its
    creation (so only the notices and reconnects a test makes drop that answer)."""

    node: Node
    key_id: int
    token: str
    http: httpx.AsyncClient
    sql: asyncpg.Connection  # the test's own session

    async def revoke_silently(self) -> None:
        """Revoke without a notice: what a node misses while its listener is away."""
        await self.sql.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", self.key_id)

    async def listener_pid(self) -> int | None:
        pid: int | None = await self.sql.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            f"dispatcher-{self.node.settings.node_id}-notices",
        )
        return pid


@pytest.fixture
async def cached(nodes: tuple[Node, Node], database_url: str) -> AsyncIterator[CachedKey]:
    node, _ = nodes
    key, token = await KeyStore(node.core.db).create(scope=api_keys.Scope.PRODUCER)
    sql = await asyncpg.connect(database_url)
    try:
        async with client(node) as http:
            # Closed: the "no key" answer cached at start was dropped by the creation's notice.
            await wait_for_status(http, 401, {}, AT_ONCE_S)
            await wait_for_status(http, 200, bearer(token), AT_ONCE_S)
            yield CachedKey(node, key.id, token, http, sql)
    finally:
        await sql.close()


async def test_a_revoke_made_while_the_listener_was_cut_counts_after_it_reconnects(
    cached: CachedKey,
) -> None:
    cut = await cached.listener_pid()
    assert cut is not None
    async with cached.sql.transaction():  # cut and revoked together: the notice cannot arrive
        assert await cached.sql.fetchval("SELECT pg_terminate_backend($1)", cut)
        await cached.revoke_silently()

    async def reconnected() -> bool:
        return await cached.listener_pid() not in (None, cut)

    await until(reconnected, 30)
    await wait_for_status(cached.http, 401, bearer(cached.token), AT_ONCE_S)


async def test_auth_answers_are_cached_between_notices(cached: CachedKey) -> None:
    """The converse of the tests here: without a notice or a reconnect a cached answer stands
    (so they show the notices at work, not a cache that was never used)."""
    await cached.revoke_silently()
    await asyncio.sleep(0.5)
    assert (await cached.http.get("/v1/jobs", headers=bearer(cached.token))).status_code == 200


async def test_a_cached_key_past_its_time_gets_503_while_postgresql_is_down(
    own_postgres: PostgresServer, amqp_url: str
) -> None:
    async with running_node(
        database_url=own_postgres.dsn("dispatcher"),
        amqp_url=amqp_url,
        node_id="keys-outage",
        shard_count=4,
        api_keys=f"{STATIC}:admin",
        api_key_cache_s=0.5,
        db_timeout_s=1.0,
    ) as node:
        _, token = await KeyStore(node.core.db).create(scope=api_keys.Scope.MONITOR)
        async with client(node) as http:

            async def answers(status: int, headers: dict[str, str]) -> bool:
                return (await http.get("/metrics", headers=headers)).status_code == status

            assert await answers(200, bearer(token))
            await asyncio.to_thread(own_postgres.kill)
            try:
                await asyncio.sleep(1.0)  # past the cache time of the answer above
                assert await answers(503, bearer(token))  # not let in on a stale answer
                assert await answers(401, {})  # auth stays on: keys were known to exist
                assert await answers(200, bearer(STATIC))  # static keys need no database
            finally:
                await asyncio.to_thread(own_postgres.start)
            # The stored key works again once PostgreSQL is back.
            await until(lambda: answers(200, bearer(token)), 30)
