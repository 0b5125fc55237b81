"""enqueue() with ``on_existing`` and ``release_key`` against a real PostgreSQL: the pending job a
key names is replaced or extended inside the caller's transaction (through
``dispatcher_enqueue_v2``), a job lets go of its key as asked, and a job asking for neither still
goes through v1, so a database without v2 takes it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import psycopg
import pytest

from consumers_sdk import enqueue as enqueue_module
from consumers_sdk.enqueue import EnqueuedJob, SchemaTooOld, enqueue, enqueue_sync
from dispatcher.store.queries import shards as queries
from tests.support.due_listener import Listener, listening
from tests.support.stored_events import STORED_EVENTS

SHARDS = 16
LATER = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    await connection.execute(queries.ENSURE_SHARDS, SHARDS)  # what a dispatcher's first start does
    yield connection
    await connection.close()


@pytest.fixture
async def listener(conn: asyncpg.Connection, database_url: str) -> AsyncIterator[Listener]:
    async with listening(database_url) as listener:
        yield listener


async def stored(conn: asyncpg.Connection, job_id: object) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    assert row is not None
    return row


async def changes(conn: asyncpg.Connection, job_id: object) -> list[tuple[str, str, str]]:
    rows = await conn.fetch(
        f"SELECT outcome, consumer, detail FROM {STORED_EVENTS} WHERE job_id = $1 ORDER BY at",
        job_id,
    )
    return [(row["outcome"], row["consumer"], row["detail"]) for row in rows]


async def test_replace_changes_the_pending_job_only_if_the_callers_transaction_commits(
    conn: asyncpg.Connection, listener: Listener
) -> None:
    first = await enqueue(conn, "users.remind", {"v": 1}, run_at=LATER, idempotency_key="u1")
    assert (first.created, first.outcome) == (True, "created")
    assert len(await listener.drained()) == 1
    replace: dict[str, Any] = {"idempotency_key": "u1", "on_existing": "replace", "priority": 2}
    transaction = conn.transaction()
    await transaction.start()
    undone = await enqueue(conn, "users.remind", {"v": 2}, delay=30, **replace)
    await transaction.rollback()
    assert (undone.id, undone.created, undone.outcome) == (first.id, False, "replaced")
    assert orjson.loads((await stored(conn, first.id))["payload"]) == {"v": 1}
    assert await listener.drained() == []  # the change's notice went with its transaction

    async with conn.transaction():
        replaced = await enqueue(conn, "users.remind", {"v": 2}, delay=30, **replace)
    row = await stored(conn, first.id)
    assert (replaced.id, replaced.outcome, replaced.run_at) == (first.id, "replaced", row["run_at"])
    assert replaced.run_at < first.run_at  # a replace takes the new time, earlier or not
    assert (orjson.loads(row["payload"]), row["priority"]) == ({"v": 2}, 2)
    [(event, actor, detail)] = await changes(conn, first.id)
    assert (event, actor) == ("replaced", "enqueue")
    assert detail.startswith("run_at ")
    [notice] = await listener.drained()
    assert notice.split(",")[0] == str(first.id)
    assert float(notice.split(",")[2]) == pytest.approx(replaced.run_at.timestamp(), abs=1e-6)


async def test_extend_moves_the_pending_job_later_never_earlier(
    conn: asyncpg.Connection, listener: Listener
) -> None:
    first = await enqueue(conn, "users.remind", "a", run_at=LATER, idempotency_key="u2")
    extend: dict[str, Any] = {"idempotency_key": "u2", "on_existing": "extend"}
    sooner = await enqueue(conn, "users.remind", "b", run_at=LATER - timedelta(minutes=5), **extend)
    assert (sooner.id, sooner.outcome, sooner.run_at) == (first.id, "kept", LATER)
    moved = await enqueue(conn, "users.remind", "c", run_at=LATER + timedelta(minutes=5), **extend)
    assert (moved.id, moved.outcome, moved.run_at) == (
        first.id,
        "extended",
        LATER + timedelta(minutes=5),
    )
    assert orjson.loads((await stored(conn, first.id))["payload"]) == "a"  # the time only
    assert [event for event, _, _ in await changes(conn, first.id)] == ["extended"]
    assert len(await listener.drained()) == 2  # the insert, the extension


async def test_a_job_dispatched_or_under_another_routing_key_is_refused_unchanged(
    conn: asyncpg.Connection,
) -> None:
    sent = await enqueue(conn, "keys.sync", "sent", idempotency_key="done")
    await conn.execute("UPDATE jobs SET state = 'dispatched' WHERE id = $1", sent.id)
    other = await enqueue(conn, "keys.a", "a", run_at=LATER, idempotency_key="other")
    for how in ("replace", "extend"):
        late = await enqueue(
            conn, "keys.sync", "late", delay=60, idempotency_key="done", on_existing=how
        )
        assert (late.id, late.created, late.outcome) == (sent.id, False, "refused")
        moved = await enqueue(
            conn,
            "keys.b",
            "b",
            run_at=LATER + timedelta(hours=1),
            idempotency_key="other",
            on_existing=how,
        )
        assert (moved.id, moved.outcome, moved.run_at) == (other.id, "refused", LATER)
    assert orjson.loads((await stored(conn, sent.id))["payload"]) == "sent"
    assert await changes(conn, sent.id) == await changes(conn, other.id) == []


@pytest.mark.parametrize("release", ["dispatched", "finished"])
async def test_a_job_lets_go_of_its_key_as_its_release_key_says(
    conn: asyncpg.Connection, release: str
) -> None:
    first = await enqueue(conn, "keys.sync", 1, idempotency_key="k", release_key=release)
    assert first.id == str(uuid.UUID(first.id))  # v2's answer is text too, as v1's
    assert (await stored(conn, first.id))["key_release"] == release
    await conn.execute("UPDATE jobs SET state = 'dispatched' WHERE id = $1", first.id)
    again = await enqueue(conn, "keys.sync", 2, idempotency_key="k")  # v1: keep
    if release == "finished":  # dispatched is not finished
        assert (again.id, again.outcome) == (first.id, "kept")
        await conn.execute("UPDATE jobs SET state = 'succeeded' WHERE id = $1", first.id)
        again = await enqueue(conn, "keys.sync", 2, idempotency_key="k")
    assert (again.created, again.outcome) == (True, "created")
    assert again.id != first.id
    row = await stored(conn, first.id)
    assert (row["idempotency_key"], row["released_key"]) == (None, "k")


async def test_a_database_without_v2_refuses_only_the_levers(conn: asyncpg.Connection) -> None:
    """A database migrated before 0019 has v1 only: jobs asking for neither lever still go in."""
    await conn.execute("DROP FUNCTION dispatcher_enqueue_v2")
    with pytest.raises(SchemaTooOld, match="migrate it with a newer dispatcher"):
        await enqueue(conn, "keys.sync", 1, idempotency_key="k", on_existing="extend")
    with pytest.raises(SchemaTooOld):
        await enqueue(conn, "keys.sync", 1, idempotency_key="k", release_key="finished")
    kept = await enqueue(conn, "keys.sync", 1, idempotency_key="k", on_existing="keep")
    assert kept.outcome == "created"


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"on_existing": "replace"}, ValueError, "on_existing needs an idempotency_key"),
    ({"release_key": "dispatched"}, ValueError, "release_key needs an idempotency_key"),
    ({"idempotency_key": "k", "on_existing": "overwrite"}, ValueError, "on_existing must be"),
    ({"idempotency_key": "k", "release_key": "later"}, ValueError, "release_key must be"),
    ({"idempotency_key": "k", "release_key": 1}, TypeError, "release_key must be a str"),
]


@pytest.mark.parametrize(("options", "error", "message"), BAD)
async def test_a_bad_lever_raises_naming_it_before_any_sql(
    conn: asyncpg.Connection, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    async with conn.transaction():
        with pytest.raises(error, match=f"^{message}"):
            await enqueue(conn, "keys.sync", 1, **options)
        assert await conn.fetchval("SELECT 1") == 1  # the transaction is still usable
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


async def test_the_levers_statement_prepares_against_the_migrated_schema(
    conn: asyncpg.Connection,
) -> None:
    await conn.prepare(enqueue_module.ENQUEUE_JOB)


async def test_the_levers_work_on_psycopg_and_answer_in_utc(
    conn: asyncpg.Connection, database_url: str
) -> None:
    def debounced() -> list[EnqueuedJob]:
        with psycopg.connect(database_url, autocommit=True) as sync:
            sync.execute("SET TimeZone = 'America/New_York'")  # psycopg answers in this zone
            return [
                enqueue_sync(
                    sync,
                    "users.remind",
                    n,
                    run_at=LATER + timedelta(minutes=n),
                    idempotency_key="u",
                    on_existing="extend",
                    release_key="dispatched",
                )
                for n in range(2)
            ]

    first, extended = await asyncio.to_thread(debounced)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
        replaced = await enqueue(
            aconn, "users.remind", 9, run_at=LATER, idempotency_key="u", on_existing="replace"
        )
    assert [job.outcome for job in (first, extended, replaced)] == [
        "created",
        "extended",
        "replaced",
    ]
    assert {job.id for job in (first, extended, replaced)} == {first.id}
    assert (extended.run_at, replaced.run_at) == (LATER + timedelta(minutes=1), LATER)
    assert extended.run_at.tzinfo == UTC
