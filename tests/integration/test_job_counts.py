"""Job counts: one node at a time counts into job_counts and every node reads them from there; a
state whose count is slow is recounted less often; /v1/stats names at most stats_routing_keys
routing keys and sums the rest, whatever producers send."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest

from dispatcher import metrics
from dispatcher.store.db import Database
from dispatcher.store.history import HistoryStore
from dispatcher.store.queries import history as queries
from dispatcher.upkeep.housekeeping import COUNT_SPACING, STATES, Housekeeper
from tests.support.nodes import client, running_node
from tests.support.waiting import eventually


@asynccontextmanager
async def node_housekeeper(
    database_url: str, stats_interval_s: float, gauges: metrics.Metrics | None = None
) -> AsyncIterator[Housekeeper]:
    """The housekeeping of one node, on its own pool."""
    db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await db.open()
    try:
        yield Housekeeper(
            HistoryStore(db),
            gauges or metrics.Metrics(),
            retention_s=86400,
            batch=100,
            stats_interval_s=stats_interval_s,
        )
    finally:
        await db.close()


@pytest.fixture
async def sql(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    yield connection
    await connection.close()


async def add_jobs(sql: asyncpg.Connection, state: str, routing_key: str, count: int) -> None:
    await sql.execute(
        "INSERT INTO jobs (id, shard, state, routing_key, payload, run_at)"
        " SELECT gen_random_uuid(), 0, $1, $2, '{}', now() FROM generate_series(1, $3)",
        state,
        routing_key,
        count,
    )


async def test_one_node_counts_and_the_others_read_its_counts(
    database_url: str, sql: asyncpg.Connection
) -> None:
    gauges = metrics.Metrics()
    async with (
        node_housekeeper(database_url, 60) as first,
        node_housekeeper(database_url, 60, gauges) as second,
    ):
        await add_jobs(sql, "scheduled", "a.one", 3)
        assert sorted(await first.refresh()) == sorted(STATES)
        await add_jobs(sql, "scheduled", "a.one", 2)

        assert await second.refresh() == []  # just counted by the first: read, not counted
        assert second.snapshot.by_state["scheduled"] == 3

        await sql.execute("UPDATE job_counts SET counted_at = counted_at - interval '1 hour'")
        async with sql.transaction():  # another node is counting
            assert await sql.fetchval(queries.TRY_COUNT_LOCK)
            assert await second.refresh() == []
            assert second.snapshot.by_state["scheduled"] == 3

        assert sorted(await second.refresh()) == sorted(STATES)
        assert second.snapshot.by_state["scheduled"] == 5
        assert second.snapshot.counts[0].routing_key == "a.one"
        sample = gauges.registry.get_sample_value
        assert sample("dispatcher_scheduled_jobs") == 5
        assert sample("dispatcher_jobs", {"state": "scheduled"}) == 5


async def test_the_states_no_index_holds_are_counted_together_each_by_its_own_keys(
    database_url: str, sql: asyncpg.Connection
) -> None:
    await add_jobs(sql, "succeeded", "a.one", 3)
    await add_jobs(sql, "succeeded", "a.two", 1)
    await add_jobs(sql, "dispatched", "a.two", 2)
    await add_jobs(sql, "scheduled", "a.three", 4)  # another state's: not counted here
    rows = await sql.fetch(queries.COUNT_UNINDEXED_STATES, ["succeeded", "dispatched"], 1)
    counted = {row["state"]: (row["routing_keys"], row["jobs"], row["other_jobs"]) for row in rows}
    assert counted == {"dispatched": (["a.two"], [2], 0), "succeeded": (["a.one"], [3], 1)}
    await sql.execute("DELETE FROM jobs WHERE state = 'dispatched'")
    [empty] = await sql.fetch(queries.COUNT_UNINDEXED_STATES, ["dispatched"], 1)
    assert (empty["state"], empty["routing_keys"], empty["other_jobs"]) == ("dispatched", [], 0)
    async with node_housekeeper(database_url, 60) as housekeeper:  # both, from one statement
        assert sorted(await housekeeper.refresh()) == sorted(STATES)
        assert housekeeper.snapshot.by_state["succeeded"] == 4
        assert housekeeper.snapshot.by_state["dispatched"] == 0


async def test_a_state_whose_count_took_long_is_recounted_less_often(
    database_url: str, sql: asyncpg.Connection
) -> None:
    async with node_housekeeper(database_url, 1) as housekeeper:
        await housekeeper.refresh()
        # Counted a minute ago; the count of succeeded jobs took 10 s, the others no time.
        await sql.execute(
            "UPDATE job_counts SET counted_at = now() - interval '60 s',"
            " count_s = CASE WHEN state = 'succeeded' THEN 10 ELSE 0 END"
        )
        counted = await housekeeper.refresh()
        assert "succeeded" not in counted
        assert "scheduled" in counted

        await sql.execute(
            "UPDATE job_counts SET counted_at = now() - make_interval(secs => 10 * $1 + 1)"
            " WHERE state = 'succeeded'",
            COUNT_SPACING,
        )
        assert "succeeded" in await housekeeper.refresh()


async def test_stats_name_at_most_the_configured_routing_keys_and_sum_the_rest(
    database_url: str, amqp_url: str
) -> None:
    later = {"payload": 1, "delay_ms": 3_600_000}
    jobs = [{"routing_key": f"k.{i:03}", **later} for i in range(500)]
    jobs += [{"routing_key": "k.busy", **later} for _ in range(20)]
    async with (
        running_node(
            database_url=database_url,
            amqp_url=amqp_url,
            shard_count=8,
            stats_interval_s=0.2,
            stats_routing_keys=50,
        ) as node,
        client(node) as http,
    ):
        stored = (await http.post("/v1/jobs/batch", json={"jobs": jobs})).json()
        busy = [job["id"] for job in stored["jobs"] if job["routing_key"] == "k.busy"]
        assert (await http.delete(f"/v1/jobs/{busy[0]}")).status_code == 200

        # Each state is counted in a round of its own, as often as its cost allows: the cancel
        # shows in each count by its next round, not in both at once.
        def counted() -> tuple[int, int]:
            by_state = node.upkeep.housekeeper.snapshot.by_state
            return by_state["scheduled"], by_state["cancelled"]

        await eventually(lambda: counted() == (519, 1), 10)
        stats = (await http.get("/v1/stats")).json()

    assert (stats["by_state"]["scheduled"], stats["by_state"]["cancelled"]) == (519, 1)
    named = {count["routing_key"] for count in stats["counts"]}
    assert len(named) == 50
    assert {"state": "scheduled", "routing_key": "k.busy", "jobs": 19} in stats["counts"]
    assert {"state": "cancelled", "routing_key": "k.busy", "jobs": 1} in stats["counts"]
    assert stats["other"]["scheduled"] == 519 - 19 - 49  # the 49 other named keys have 1 each
    assert sum(c["jobs"] for c in stats["counts"]) + sum(stats["other"].values()) == 520
    assert set(stats["counted_at_by_state"]) == set(STATES)
