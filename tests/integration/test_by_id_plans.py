"""The statements that change in-flight jobs named by id find them through jobs_pkey, whether
planned for their values or as the generic plan a prepared statement may switch to: never by
reading the 'dispatching' range of jobs_state or jobs_leased, which statistics call small but
which, while a snapshot is held, keeps a dead entry for every job fired since."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from dispatcher.store.queries import scheduler as queries

# $1 ids, then the node id where the statement takes one.
BY_ID = {
    "MARK_DISPATCHED": queries.MARK_DISPATCHED,
    "MARK_EXPIRED": queries.MARK_EXPIRED,
    "RELEASE_CLAIMS": queries.RELEASE_CLAIMS,
    "RELEASE_CLAIMS_ANNOUNCED": queries.RELEASE_CLAIMS_ANNOUNCED,
}


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """20 000 jobs, 50 of them in flight: the statistics of a node confirming as it fires."""
    connection = await asyncpg.connect(database_url)
    await connection.execute(
        """
        INSERT INTO jobs (id, shard, state, routing_key, payload, run_at, lease_until, claimed_by)
        SELECT gen_random_uuid(), g % 32,
               CASE WHEN g <= 50 THEN 'dispatching' ELSE 'dispatched' END,
               'plans.work', '\\x00', now(),
               CASE WHEN g <= 50 THEN now() + interval '30 s' END,
               CASE WHEN g <= 50 THEN 'node' END
        FROM generate_series(1, 20000) AS g
        """
    )
    await connection.execute("ANALYZE jobs")
    yield connection
    await connection.close()


def indexes(plan: dict[str, Any]) -> set[str]:
    found = {plan["Index Name"]} if "Index Name" in plan else set()
    if plan.get("Node Type") == "Seq Scan":
        found.add(f"seq {plan['Relation Name']}")
    for child in plan.get("Plans", []):
        found |= indexes(child)
    return found


@pytest.mark.parametrize("name", sorted(BY_ID))
@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_in_flight_jobs_named_by_id_are_found_by_id(
    db: asyncpg.Connection, name: str, mode: str
) -> None:
    ids = [row["id"] for row in await db.fetch("SELECT id FROM jobs ORDER BY id LIMIT 20")]
    statement = BY_ID[name]
    arguments: list[object] = [ids, "node"] if "$2" in statement else [ids]
    async with db.transaction():
        await db.execute(f"SET LOCAL plan_cache_mode = {mode}")
        plan = json.loads(await db.fetchval(f"EXPLAIN (FORMAT JSON) {statement}", *arguments))
    assert indexes(plan[0]["Plan"]) == {"jobs_pkey"}
