"""The database contract (sql/0012) against a real PostgreSQL: the due notice its function sends
is what the dispatcher parses, the SDK's ``enqueue`` and the HTTP intake choose the same shard for
the same id, and an older SDK's own statement still works."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from consumers_sdk import enqueue as enqueue_module
from consumers_sdk import ids
from dispatcher.models import DueEntry
from dispatcher.node import Node
from dispatcher.store import due_notices
from dispatcher.store.queries import shards as queries
from tests.support.nodes import client, running_node

SHARDS = 16

# The statement of the SDK before migration 0012, as applications still running it send it.
OLDER_SDK_INSERT_JOB = """
INSERT INTO jobs (id, shard, routing_key, payload, headers, priority, ttl_ms, idempotency_key,
                  run_at, namespace)
VALUES ($1, ($2::bigint % (SELECT count(*) FROM shard_epochs))::int, $3, $4, $5::jsonb, $6, $7,
        $8, $9, $10)
ON CONFLICT ((coalesce(namespace, '')), idempotency_key) WHERE idempotency_key IS NOT NULL
DO NOTHING
RETURNING id, run_at,
    pg_notify('dispatcher_due',
              id::text || ',' || shard || ',' || extract(epoch FROM run_at) || ',' || routing_key)
"""


class Notices:
    """A raw LISTEN on the due channel, as a dispatcher node holds one."""

    def __init__(self) -> None:
        self.payloads: asyncio.Queue[str] = asyncio.Queue()

    def on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.put_nowait(payload)

    async def next(self) -> DueEntry:
        payload = await asyncio.wait_for(self.payloads.get(), 10)
        entry = due_notices.parse(payload)
        assert entry is not None, payload
        return entry


class FixedIds:
    """Hands out the ids given, in order (what ``enqueue``'s generator would have made)."""

    def __init__(self, given: list[uuid.UUID]) -> None:
        self._given: Iterator[uuid.UUID] = iter(given)

    def next(self) -> uuid.UUID:
        return next(self._given)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    await connection.execute(queries.ENSURE_SHARDS, SHARDS)
    yield connection
    await connection.close()


@pytest.fixture
async def notices(database_url: str) -> AsyncIterator[Notices]:
    connection = await asyncpg.connect(database_url)
    listening = Notices()
    await connection.add_listener(due_notices.CHANNEL, listening.on_notify)
    yield listening
    await connection.close()


async def test_the_notice_function_sends_what_the_dispatcher_parses(
    conn: asyncpg.Connection, notices: Notices
) -> None:
    job_id = uuid.uuid4()
    run_at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    await conn.execute("SELECT dispatcher_notify_due_v1($1, 7, $2, 'orders.x')", job_id, run_at)
    entry = await notices.next()
    assert (entry.id, entry.shard, entry.key) == (job_id, 7, "orders.x")
    assert entry.run_at_s == pytest.approx(run_at.timestamp(), abs=1e-6)
    await conn.execute("SELECT dispatcher_notify_due_v1($1, 3, $2, NULL)", job_id, run_at)
    bare = await notices.next()
    assert (bare.id, bare.shard, bare.key) == (job_id, 3, "")


async def test_an_older_sdks_own_statement_still_inserts_and_its_notice_parses(
    conn: asyncpg.Connection, notices: Notices
) -> None:
    job_id = ids.JobIds().next()
    run_at = datetime.now(UTC) + timedelta(seconds=30)
    row = await conn.fetchrow(
        OLDER_SDK_INSERT_JOB,
        *(job_id, ids.id_hash(job_id.bytes), "orders.old", b"{}", "{}"),
        *(None, None, None, run_at, None),
    )
    assert row is not None
    entry = await notices.next()
    shard = ids.shard_for(job_id.bytes, range(SHARDS))
    assert (entry.id, entry.shard, entry.key) == (job_id, shard, "orders.old")
    stored = await conn.fetchrow("SELECT shard, state FROM jobs WHERE id = $1", job_id)
    assert stored is not None
    assert (stored["shard"], stored["state"]) == (shard, "scheduled")


async def test_enqueue_on_a_database_without_the_contract_function_says_so(
    conn: asyncpg.Connection,
) -> None:
    await conn.execute("DROP FUNCTION dispatcher_enqueue_v1")
    with pytest.raises(enqueue_module.SchemaTooOld):
        await enqueue_module.enqueue(conn, "orders.x", 1)


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, node_id="contract", shard_count=SHARDS
    ) as running:
        yield running


async def test_enqueue_and_the_http_intake_put_the_same_id_on_the_same_shard(
    node: Node, database_url: str, notices: Notices, monkeypatch: pytest.MonkeyPatch
) -> None:
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()  # past the look-ahead: any shard
    jobs = [{"routing_key": "orders.same", "payload": i, "run_at": later} for i in range(40)]
    async with client(node) as http:
        response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201
    job_ids = [uuid.UUID(job["id"]) for job in response.json()["jobs"]]
    conn = await asyncpg.connect(database_url)
    try:
        # The intake sent no notice (it puts its own jobs on its heap): the marker comes first.
        marker = uuid.uuid4()
        await conn.execute("SELECT dispatcher_notify_due_v1($1, 0, now(), 'm')", marker)
        assert (await notices.next()).id == marker
        query = "SELECT id, shard FROM jobs WHERE id = ANY($1) ORDER BY id"
        by_intake = await conn.fetch(query, job_ids)
        assert len(by_intake) == len(job_ids)
        await conn.execute("DELETE FROM jobs WHERE id = ANY($1)", job_ids)
        monkeypatch.setattr(enqueue_module, "_IDS", FixedIds(sorted(job_ids)))
        for _ in job_ids:
            await enqueue_module.enqueue(conn, "orders.same", 1, delay=timedelta(hours=2))
        by_enqueue = await conn.fetch(query, job_ids)
        notified = {(entry.id, entry.shard) for entry in [await notices.next() for _ in job_ids]}
    finally:
        await conn.close()
    assert [tuple(row) for row in by_enqueue] == [tuple(row) for row in by_intake]
    assert {tuple(row) for row in by_intake} == notified
    assert len({row["shard"] for row in by_intake}) > 1  # the ids spread: the hash chose
    for row in by_intake:
        assert row["shard"] == ids.shard_for(row["id"].bytes, range(SHARDS))
