"""At a million jobs, every filter of GET /v1/jobs reads the index made for it, and counting reads
one state's range of an index, never the whole table: checked with EXPLAIN on the service's own
statements, both as first planned (with the values) and as the generic plan PostgreSQL's plan
cache may switch a prepared statement to after five runs."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from consumers_sdk.ids import JobIds
from devstack import million
from devstack.postgres import PostgresServer
from dispatcher import models
from dispatcher.store.queries import bulk_actions, history

# The states in flight, and a rare finished one. The bulk of finished jobs is half the table: any
# plan reads much of it, and that count is the one spaced out (see upkeep/housekeeping.py).
HOT_STATES = ["scheduled", "dispatching", "waiting", "dead"]
ROWS_HALF = million.ROWS // 2  # a cursor halfway: a bulk action part done


@pytest.fixture(scope="module")
def million_jobs(pg_server: PostgresServer, pg_template: str) -> Iterator[str]:
    """One database of a million jobs for the whole module (loading takes seconds)."""
    name = f"plans_{uuid.uuid4().hex}"
    pg_server.create_database(name, template=pg_template)

    async def fill() -> None:
        connection = await asyncpg.connect(pg_server.dsn(name))
        try:
            await million.load(connection)
        finally:
            await connection.close()

    asyncio.run(fill())
    yield pg_server.dsn(name)
    pg_server.drop_database(name)


def literal(value: Any) -> str:
    """A parameter as SQL text for EXECUTE (the test's own values, never input)."""
    if value is None:
        return "NULL"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, uuid.UUID):
        return f"'{value}'::uuid"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(literal(item) for item in value) + "]"
    return "'" + str(value).replace("'", "''") + "'"


async def plans(dsn: str, query: str, args: tuple[Any, ...]) -> tuple[dict[str, Any], ...]:
    """The plan with the parameters' values, and the generic plan of the prepared statement."""
    connection = await asyncpg.connect(dsn)
    try:
        custom = await connection.fetchval(f"EXPLAIN (FORMAT JSON) {query}", *args)
        await connection.execute("SET plan_cache_mode = force_generic_plan")
        await connection.execute(f"PREPARE probe AS {query}")
        values = f"({', '.join(literal(arg) for arg in args)})" if args else ""
        generic = await connection.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE probe{values}")
    finally:
        await connection.close()
    return json.loads(custom)[0]["Plan"], json.loads(generic)[0]["Plan"]


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


# Read whole by design: a few seconds' worth of claims, a row each (sql/0030).
SMALL_TABLES = {"claims"}


def seq_scans(plan: dict[str, Any]) -> list[str]:
    return [
        n["Relation Name"]
        for n in nodes(plan)
        if n["Node Type"] == "Seq Scan" and n["Relation Name"] not in SMALL_TABLES
    ]


def indexes(plan: dict[str, Any]) -> set[str]:
    return {n["Index Name"] for n in nodes(plan) if "Index Name" in n}


@pytest.mark.parametrize(
    ("index", "query", "args"),
    [pytest.param(index, query, args, id=name) for name, index, query, args in million.LIST_CASES],
)
async def test_each_list_filter_reads_its_index(
    million_jobs: str, index: str, query: str, args: tuple[Any, ...]
) -> None:
    custom, generic = await plans(million_jobs, query, args)
    assert seq_scans(custom) == [], json.dumps(custom, indent=1)
    assert seq_scans(generic) == [], json.dumps(generic, indent=1)
    assert index in indexes(custom), json.dumps(custom, indent=1)


@pytest.mark.parametrize("state", HOT_STATES)
async def test_counting_a_state_reads_only_its_range_of_an_index(
    million_jobs: str, state: str
) -> None:
    for plan in await plans(million_jobs, history.COUNT_STATE, (state, 50)):
        assert seq_scans(plan) == [], json.dumps(plan, indent=1)
        assert indexes(plan) & {"jobs_rest", "jobs_due", "jobs_pkey"}


async def test_what_every_node_reads_each_round_is_the_counts_table_only(million_jobs: str) -> None:
    states = [state.value for state in models.JobState]
    for query, args in (
        (history.SELECT_COUNTS, ()),
        (history.STATES_TO_COUNT, (states, 7.5, 50.0)),
    ):
        for plan in await plans(million_jobs, query, args):
            scanned = {n["Relation Name"] for n in nodes(plan) if "Relation Name" in n}
            assert scanned <= {"job_counts"}, json.dumps(plan, indent=1)


async def test_the_consoles_grouped_next_due_reads_the_due_index_only(million_jobs: str) -> None:
    for plan in await plans(million_jobs, history.NEXT_DUE_BY_MINUTE, (3600.0, 60, 10_000)):
        assert seq_scans(plan) == [], json.dumps(plan, indent=1)
        assert indexes(plan) == {"jobs_due"}, json.dumps(plan, indent=1)
        # Bounded by the LIMIT under the grouping, not by how many jobs are scheduled.
        grouping = [n for n in nodes(plan) if n["Node Type"] == "Aggregate"]
        assert grouping, json.dumps(plan, indent=1)
        below = list(nodes(grouping[0]))[1:]
        assert any(n["Node Type"] == "Limit" for n in below), json.dumps(plan, indent=1)


# Two events for each of the jobs $1, a batch of 500 each, as consumers' deliveries record them.
MANY_EVENTS = """
INSERT INTO event_batches (job_keys, event_ids, job_ids, outcomes, attempts, consumer_groups,
                           consumers, errors, ats, rounds, ignored, details)
SELECT array_agg(DISTINCT dispatcher_id_key(id)), array_agg(gen_random_uuid()), array_agg(id),
       array_agg(outcome), array_agg(1), array_agg('g'::text), array_agg('c'::text),
       array_agg(NULL::text), array_agg(now()), array_agg(gen_random_uuid()),
       array_agg(NULL::text), array_agg(NULL::text)
FROM unnest($1::uuid[]) WITH ORDINALITY AS j(id, n),
     (VALUES ('started'), ('succeeded')) AS o(outcome)
GROUP BY o.outcome, (n - 1) / 500
"""


async def test_a_jobs_history_reads_the_batches_of_its_key_only(million_jobs: str) -> None:
    """``event_batches_job_keys``: a bitmap of the batches naming the job's key, whatever the
    number of batches, planned with the value or generic."""
    clock = iter(range(10**15, 10**16, 20_000))  # UUIDv7 ids, 50 a millisecond
    made = JobIds(clock_ns=lambda: next(clock))
    job_ids = [made.next() for _ in range(200_000)]
    connection = await asyncpg.connect(million_jobs)
    try:
        await connection.execute(MANY_EVENTS, job_ids)
        await connection.execute("ANALYZE event_batches")
    finally:
        await connection.close()
    for plan in await plans(million_jobs, history.SELECT_JOB_EVENTS, (job_ids[1000], 50)):
        assert "event_batches" not in seq_scans(plan), json.dumps(plan, indent=1)
        assert "event_batches_job_keys" in indexes(plan), json.dumps(plan, indent=1)


# A bulk action's batch (the sample of its dry run runs the same pick), as the API passes the
# filter: by routing key, dead jobs with an error text, two states with a tenant and a prefix.
# Each batch is planned with its values (``PLAN_EACH_RUN``); the generic plan reads no table whole.
BULK_CASES = [
    ("a routing key", "jobs_key", ["scheduled", "waiting"], "rk.3", None, None),
    ("dead jobs", "jobs_rest", ["dead", None], None, None, "timeout"),
    ("two states, a tenant, a prefix", "jobs_rest", ["scheduled", "waiting"], None, "ns-1", None),
    ("scheduled jobs from the cursor", "jobs_due", ["scheduled", None], None, None, None),
]


@pytest.mark.parametrize(
    ("index", "states", "routing_key", "namespace", "error"),
    [pytest.param(*case[1:], id=case[0]) for case in BULK_CASES],
)
async def test_a_bulk_batch_walks_the_filters_index_from_its_cursor(
    million_jobs: str,
    index: str,
    states: list[str | None],
    routing_key: str | None,
    namespace: str | None,
    error: str | None,
) -> None:
    match = [namespace, routing_key, "rk" if namespace else None, None, None, None, None, error]
    args = (uuid.UUID(int=ROWS_HALF), 500, *states, *match, None)
    custom, generic = await plans(million_jobs, bulk_actions.BULK_SAMPLE, args)
    assert seq_scans(custom) == [], json.dumps(custom, indent=1)
    assert seq_scans(generic) == [], json.dumps(generic, indent=1)
    assert index in indexes(custom), json.dumps(custom, indent=1)
