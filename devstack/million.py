"""A jobs table of a million rows shaped like a real one, and the list queries to ask of it, for the
query-plan test and ``bench.list_queries``.

Ids grow with creation time (as UUIDv7 ids do), and the newest jobs are the ones still scheduled,
in flight or waiting while the older ones are finished: the shape that makes "walk the primary
key and filter" slow for the states people list most. 500 routing keys of very different sizes;
half the jobs in the default namespace, the rest in ten tenants, one of which started recently
and one of which is tiny.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from dispatcher.store.queries import intake, job_reads

ROWS = 1_000_000

# $1 rows. Row i has id i, so a test can name the id of a row.
LOAD = """
INSERT INTO jobs (id, shard, state, routing_key, payload, idempotency_key, run_at, namespace,
                  created_at, updated_at, lease_until)
SELECT lpad(to_hex(i), 32, '0')::uuid, i % 256, s.state,
       'rk.' || floor(500 * power(((i * 7907) % 10007) / 10007.0, 3))::int,
       '{"order": 1}'::bytea,
       CASE WHEN i % 3 = 0 THEN 'idem-' || i END,
       now() + make_interval(secs => (i - 0.89 * $1::bigint) / 10.0),
       CASE WHEN i % 1000 = 0 THEN 'small'
            WHEN i > 0.95 * $1::bigint AND i % 7 = 0 THEN 'late'
            WHEN i % 2 = 0 THEN NULL
            ELSE 'ns-' || (i % 10) END,
       now() - make_interval(secs => ($1::bigint - i) / 10.0),
       now() - make_interval(secs => ($1::bigint - i) / 10.0),
       CASE WHEN s.state = 'dispatching' THEN now() + interval '30 s' END
FROM generate_series(1, $1::bigint) AS i,
LATERAL (SELECT CASE
    WHEN i > 0.89 * $1::bigint THEN CASE WHEN i % 50 = 0 THEN 'waiting' ELSE 'scheduled' END
    WHEN i > 0.885 * $1::bigint THEN 'dispatching'
    WHEN (i * 7919) % 1000 < 350 THEN 'dispatched'
    WHEN (i * 7919) % 1000 < 930 THEN 'succeeded'
    WHEN (i * 7919) % 1000 < 940 THEN 'dead'
    WHEN (i * 7919) % 1000 < 980 THEN 'cancelled'
    ELSE 'expired' END AS state) AS s
"""

START = uuid.UUID(int=0)  # the cursor of a first page
PAGE_BYTES = 4 * 1024 * 1024  # DISPATCHER_MAX_PAGE_BYTES's default
MIDDLE = uuid.UUID(int=ROWS * 95 // 100)  # a page among the newest jobs


def case(name: str, index: str, query: str, *args: Any) -> tuple[str, str, str, tuple[Any, ...]]:
    return (name, index, query, args)


def page_case(
    name: str,
    index: str,
    *,
    state: str | None = None,
    routing_key: str | None = None,
    after: uuid.UUID = START,
    limit: int = 100,
    namespace: str | None = None,
    routing_keys: list[str] | None = None,
    prefix: str | None = None,
) -> tuple[str, str, str, tuple[Any, ...]]:
    """A page of GET /v1/jobs: LIST_JOBS's parameters in their order ($1..$8)."""
    arguments = (state, routing_key, after, limit, namespace, routing_keys, PAGE_BYTES, prefix)
    return case(name, index, job_reads.LIST_JOBS, *arguments)


# (what the caller asks, the index that must serve it, the query, its parameters): every filter
# of GET /v1/jobs, alone and with a tenant's namespace, as the API passes them to the store.
LIST_CASES = [
    page_case("every job", "jobs_pkey"),
    # Scheduled jobs in due order, whatever else filters them; the states no index names
    # (dispatched, succeeded: the bulk of the table) walk the primary key.
    page_case("a state", "jobs_due", state="scheduled"),
    page_case("scheduled, a later page", "jobs_due", state="scheduled", after=MIDDLE),
    page_case("a state, a later page", "jobs_rest", state="waiting", after=MIDDLE),
    page_case("a rare state", "jobs_rest", state="dead", limit=50),
    # In flight: the claims' rows (a few seconds' worth, read whole), each job by its key.
    page_case("in flight", "jobs_pkey", state="dispatching"),
    page_case("the bulk of the table", "jobs_pkey", state="succeeded"),
    page_case("a routing key", "jobs_key", routing_key="rk.499"),
    page_case("state and routing key", "jobs_key", state="dead", routing_key="rk.3"),
    page_case("scheduled and a routing key", "jobs_due", state="scheduled", routing_key="rk.3"),
    page_case("a new tenant", "jobs_namespace", namespace="late"),
    page_case("a tiny tenant", "jobs_namespace", namespace="small"),
    page_case("default namespace", "jobs_pkey", namespace=""),
    page_case("tenant and state", "jobs_due", state="scheduled", namespace="late"),
    page_case("tenant and key", "jobs_key", routing_key="rk.7", namespace="ns-3"),
    case(
        "idempotency key, any namespace",
        "jobs_idempotency_key_namespace",
        intake.SELECT_BY_IDEMPOTENCY_KEY,
        "idem-999",
        None,
        None,
    ),
    case(
        "idempotency key, a namespace",
        "jobs_idempotency_key_namespace",
        intake.SELECT_BY_IDEMPOTENCY_KEY,
        "idem-999",
        "ns-9",
        None,
    ),
    # A routing-key prefix rides the other filters' index (jobs_due carries the routing key), and
    # alone walks the primary key: a range of jobs_key would be right in byte order (C) only.
    page_case("a state and a prefix", "jobs_due", state="scheduled", prefix="rk"),
    page_case("a rare state and a prefix", "jobs_rest", state="dead", prefix="rk"),
    page_case("a tenant and a prefix", "jobs_namespace", namespace="late", prefix="rk"),
    page_case("a prefix", "jobs_pkey", prefix="rk"),
    # A key limited to routing-key prefixes: the tenant's index, the prefixes tested on its rows.
    page_case(
        "a new tenant's prefixed key", "jobs_namespace", namespace="late", routing_keys=["rk"]
    ),
]


# The claims of the jobs in flight, 25 to a claim as the dispatcher makes them (sql/0030).
CLAIMS = """
INSERT INTO claims (node, lease_until, ids, shards, epochs)
SELECT NULL, min(lease_until), array_agg(id ORDER BY id), array_agg(shard ORDER BY id),
       array_agg(0::bigint)
FROM (SELECT id, shard, lease_until, (row_number() OVER (ORDER BY id) - 1) / 25 AS claim
      FROM jobs WHERE state = 'dispatching') AS claimed
GROUP BY claim
"""


async def load(connection: asyncpg.Connection, rows: int = ROWS) -> None:
    """Fill the (migrated, empty) jobs table and the claims of its jobs in flight, then vacuum
    and analyse them as autovacuum would."""
    await connection.execute(LOAD, rows)
    await connection.execute(CLAIMS)
    await connection.execute("VACUUM ANALYZE jobs")
    await connection.execute("VACUUM ANALYZE claims")
