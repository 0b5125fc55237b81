"""A snapshot held too long (a report's open transaction) is said in ``/readyz`` and
``/metrics`` while the node stays ready: a real node on a real PostgreSQL, a session the test
holds open under an application name of its own, then ends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from dispatcher.api import ops
from dispatcher.store.db import Database
from dispatcher.store.snapshots import SnapshotStore
from tests.support.nodes import client, running_node
from tests.support.waiting import until

ADMIN = "admin-token-0123456789"
MONITOR = "monitor-token-0123456789"
API_KEYS = f"{ADMIN}:admin,{MONITOR}:monitor"
REPORT = "nightly-report"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
async def report(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A session that will hold a snapshot when the test begins its transaction."""
    connection = await asyncpg.connect(database_url, server_settings={"application_name": REPORT})
    yield connection
    await connection.close()


async def vacuum(http: httpx.AsyncClient, token: str = ADMIN) -> dict[str, Any]:
    answer = await http.get("/readyz", headers=bearer(token))
    assert answer.status_code == 200, answer.text  # a warning: the node stays ready
    state: dict[str, Any] = answer.json()["vacuum"]
    return state


async def held_back_metric(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics", headers=bearer(ADMIN))).text
    [line] = [line for line in text.splitlines() if line.startswith("dispatcher_vacuum_held_back ")]
    return float(line.split()[1])


async def test_a_snapshot_older_than_the_setting_is_said_in_readyz_and_metrics_until_it_ends(
    database_url: str, amqp_url: str, report: asyncpg.Connection
) -> None:
    async with (
        running_node(
            database_url=database_url,
            amqp_url=amqp_url,
            node_id="vacuum",
            shard_count=4,
            api_keys=API_KEYS,
            snapshot_warn_s=1.0,
            stats_interval_s=0.2,
        ) as node,
        client(node) as http,
    ):
        transaction = report.transaction(isolation="repeatable_read")
        await transaction.start()
        await report.fetchval("SELECT count(*) FROM jobs")

        async def held_back() -> bool:
            return bool((await vacuum(http))["held_back"])

        await until(held_back, 20)
        shown = await vacuum(http)
        assert REPORT in shown["holder"]
        # Shown to a tenth of a second: a snapshot just past the setting reads 1.0.
        assert shown["oldest_snapshot_s"] >= 1.0
        assert shown["sees_all_sessions"] is True
        assert await held_back_metric(http) == 1.0
        assert (await vacuum(http, MONITOR))["holder"] == ops.WITHHELD  # who: for admin keys

        await transaction.rollback()

        async def released() -> bool:
            return not (await vacuum(http))["held_back"]

        await until(released, 20)
        assert await held_back_metric(http) == 0.0


async def test_a_role_without_pg_monitor_is_told_it_cannot_see_when_others_snapshots_began(
    database_url: str, report: asyncpg.Connection
) -> None:
    """Other roles' sessions show when their transaction began only to a role with
    pg_read_all_stats (pg_monitor)."""
    role = f"watcher_{uuid.uuid4().hex[:12]}"  # roles are the whole server's
    await report.execute(f"CREATE ROLE {role} LOGIN")
    parts = urlsplit(database_url)
    restricted = Database(
        urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}")),
        min_size=1,
        max_size=1,
        timeout_s=5,
    )
    superuser = Database(database_url, min_size=1, max_size=1, timeout_s=5)
    transaction = report.transaction(isolation="repeatable_read")
    await transaction.start()
    await report.fetchval("SELECT count(*) FROM jobs")
    try:
        await restricted.open()
        await superuser.open()
        unseen = await SnapshotStore(restricted).look(5)
        seen = await SnapshotStore(superuser).look(5)
    finally:
        await restricted.close()
        await superuser.close()
        await transaction.rollback()
        await report.execute(f"DROP ROLE {role}")
    assert unseen.sees_all_sessions is False
    # Seen either way, but without its start: its age counts from the node's first look.
    [report_unseen] = [holder for holder in unseen.holders if REPORT in holder.name]
    assert report_unseen.held_s is None
    assert seen.sees_all_sessions is True
    [report_seen] = [holder for holder in seen.holders if REPORT in holder.name]
    assert report_seen.held_s is not None


async def test_a_snapshot_held_in_another_database_is_not_named(
    database_url: str, empty_database_url: str, report: asyncpg.Connection
) -> None:
    """PostgreSQL keeps dead rows of this database's tables for this database's snapshots (and a
    standby's, which belong to none): a report on another database of the same server holds
    nothing back here, and naming it would send an operator after the wrong session."""
    elsewhere = await asyncpg.connect(
        empty_database_url, server_settings={"application_name": "elsewhere-report"}
    )
    store = Database(database_url, min_size=1, max_size=1, timeout_s=5)
    far = elsewhere.transaction(isolation="repeatable_read")
    near = report.transaction(isolation="repeatable_read")
    try:
        await far.start()
        await elsewhere.fetchval("SELECT count(*) FROM pg_class")
        await near.start()
        await report.fetchval("SELECT count(*) FROM jobs")
        await store.open()
        names = [holder.name for holder in (await SnapshotStore(store).look(5)).holders]
    finally:
        await store.close()
        await near.rollback()
        await far.rollback()
        await elsewhere.close()
    assert any(REPORT in name for name in names), names
    assert not any("elsewhere-report" in name for name in names), names
