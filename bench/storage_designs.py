"""Prototypes of the job table's candidate designs, measured on one workload before one is built
(docs/development/job-storage.md): what each costs PostgreSQL's storage per job.

Each candidate gets a fresh database and the same life for every job, in batches as the
dispatcher runs them, each step a transaction of its own: insert, claim, confirm, the consumer's
``started`` events, its ``succeeded`` events with the outcome. The statements are reduced to what
decides the cost (the rows and index entries each writes); ``today`` stands for the current
schema (the migrations) and statements, so its figure can be checked against
``bench.end_to_end``'s.

    .venv/bin/python -m bench.storage_designs [--jobs 20000] [--batch 500] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from bench import harness, storage
from consumers_sdk.ids import JobIds
from devstack.base import service_root
from devstack.ports import reserve_port
from devstack.postgres import QUEUE_SETTINGS, PostgresServer
from dispatcher.store.queries.shared import note_events

Step = Callable[[asyncpg.Connection, list[uuid.UUID]], Awaitable[None]]

# The new job table the candidates share: what never changes after the insert first, what the
# claim, the confirm and the outcome change together at the row's end (a HOT update logs only
# the bytes between an unchanged prefix and suffix), and room on each page for the next versions.
JOBS_HOT = """
CREATE TABLE jobs_next (
    id uuid PRIMARY KEY,
    shard integer NOT NULL,
    run_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    priority smallint,
    ttl_ms bigint,
    routing_key text NOT NULL,
    namespace text,
    idempotency_key text,
    payload bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{}',
    dispatch_round uuid NOT NULL DEFAULT gen_random_uuid(),
    pending boolean NOT NULL DEFAULT true,
    publish_attempts integer NOT NULL DEFAULT 0,
    claim_epoch bigint,
    lease_until timestamptz,
    dispatched_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    state text NOT NULL DEFAULT 'scheduled'
) WITH (fillfactor = {fillfactor});
CREATE INDEX jobs_next_key ON jobs_next (routing_key, id);
"""
DUE_ON_PENDING = "CREATE INDEX jobs_next_due ON jobs_next (run_at, id) WHERE pending;"
# Outcome events, one row for each batch received.
EVENT_BATCHES = """
CREATE TABLE event_batches (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    received_at timestamptz NOT NULL DEFAULT now(),
    event_ids uuid[] NOT NULL,
    job_ids uuid[] NOT NULL,
    outcomes text[] NOT NULL,
    attempts integer[] NOT NULL,
    consumers text[] NOT NULL,
    ats timestamptz[] NOT NULL
);
"""
EVENTS_BY_JOB = "CREATE INDEX event_batches_jobs ON event_batches USING gin (job_ids);"
# Coarser: the milliseconds the batch's job ids were made in (a UUIDv7's first 48 bits), a few
# keys a batch since jobs made together fire together; a job's events are in the batches of its
# millisecond, its own found in their arrays.
EVENTS_BY_JOB_MS = """
ALTER TABLE event_batches ADD COLUMN job_ms bigint[];
CREATE INDEX event_batches_job_ms ON event_batches USING gin (job_ms);
"""
# Claims, one row for each batch claimed.
CLAIM_BATCHES = """
CREATE TABLE claim_batches (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    shard integer NOT NULL,
    epoch bigint NOT NULL,
    node text NOT NULL,
    lease_until timestamptz NOT NULL,
    confirmed_at timestamptz,
    ids uuid[] NOT NULL
);
"""
# Pending jobs by due time, apart from the job's row: fired ones stay until their partition is
# truncated (not measured here: it writes no WAL a row).
PENDING_TABLE = """
CREATE TABLE pending (run_at timestamptz NOT NULL, id uuid NOT NULL, shard integer NOT NULL);
CREATE INDEX pending_due ON pending (run_at, id);
"""

# The states few jobs are in (waiting, dead, cancelled, expired) listed apart: a column the
# success path never changes, so an index on it keeps every update of that path HOT; and the
# pending entries listed in id order too (listing scheduled jobs without an index on state).
REST_AND_PENDING_IDS = """
ALTER TABLE jobs_next ADD COLUMN rest text;
CREATE INDEX jobs_next_rest ON jobs_next (rest, id) WHERE rest IS NOT NULL;
CREATE INDEX pending_id ON pending (id);
"""

# Due entries kept in the job table after all, in an index no update changes (no predicate: every
# job, fired or not, by its run_at, which only a reschedule moves): no pending row to insert, and
# the settle still HOT. The loads and the straggler look then test each entry's state on its row.
DUE_EVERY_JOB = """
ALTER TABLE jobs_next ADD COLUMN rest text;
CREATE INDEX jobs_next_rest ON jobs_next (rest, id) WHERE rest IS NOT NULL;
CREATE INDEX jobs_next_due_all ON jobs_next (run_at, id);
"""

INSERT_NEXT = """
INSERT INTO jobs_next (id, shard, run_at, routing_key, payload)
SELECT id, 1, now() + interval '1 second', 'bench.e2e', '7'::bytea FROM unnest($1::uuid[]) AS id
"""


async def insert_today(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(
        """
        INSERT INTO jobs (id, shard, routing_key, payload, run_at)
        SELECT id, 1, 'bench.e2e', '7'::bytea, now() + interval '1 second'
        FROM unnest($1::uuid[]) AS id
        ON CONFLICT DO NOTHING
        """,
        ids,
    )


async def claim_today(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(
        """
        UPDATE jobs SET state = 'dispatching', lease_until = now() + interval '30 seconds',
            claim_epoch = 1, claimed_by = 'n0', publish_attempts = publish_attempts + 1,
            updated_at = now()
        WHERE id = ANY($1::uuid[])
        """,
        ids,
    )


async def confirm_today(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(
        """
        UPDATE jobs SET state = 'dispatched', dispatched_at = now(), lease_until = NULL,
            updated_at = now()
        WHERE id = ANY($1::uuid[])
        """,
        ids,
    )


# The migrations' event batches (sql/0025), written as RECORD_EVENTS writes them: a row a
# delivery. $1 job ids, $2 outcome.
TODAY_EVENTS = note_events(
    "unnest($1::uuid[]) AS id",
    job_id="id",
    outcome="$2::text",
    attempt="1",
    group="'bench'::text",
    consumer="'c1'::text",
    round_="gen_random_uuid()",
)


async def started_today(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(TODAY_EVENTS, ids, "started")


async def final_today(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(TODAY_EVENTS, ids, "succeeded")
    await connection.execute(
        "UPDATE jobs SET state = 'succeeded', updated_at = now() WHERE id = ANY($1::uuid[])", ids
    )


async def insert_next(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(INSERT_NEXT, ids)


async def insert_next_pending(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(INSERT_NEXT, ids)
    await connection.execute(
        "INSERT INTO pending SELECT now() + interval '1 second', id, 1 FROM unnest($1::uuid[]) id",
        ids,
    )


async def claim_row(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    """The claim as a row version: leaves the due index (not HOT)."""
    await connection.execute(
        """
        UPDATE jobs_next SET pending = false, state = 'dispatching', claim_epoch = 1,
            lease_until = now() + interval '30 seconds', publish_attempts = publish_attempts + 1,
            updated_at = now()
        WHERE id = ANY($1::uuid[])
        """,
        ids,
    )


async def confirm_row(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(
        """
        UPDATE jobs_next SET state = 'dispatched', dispatched_at = now(), updated_at = now()
        WHERE id = ANY($1::uuid[])
        """,
        ids,
    )


async def claim_batch(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(
        """
        INSERT INTO claim_batches (shard, epoch, node, lease_until, ids)
        VALUES (1, 1, 'n0', now() + interval '30 seconds', $1::uuid[])
        """,
        ids,
    )


async def claim_batch_locking(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    """A claim batch that also share-locks its jobs' rows: a cancel or reschedule in flight
    waits for it (a lock record a job, no row version)."""
    await connection.execute(
        "SELECT FROM jobs_next WHERE id = ANY($1::uuid[]) ORDER BY id FOR SHARE", ids
    )
    await claim_batch(connection, ids)


async def confirm_batch(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await connection.execute(
        "UPDATE claim_batches SET confirmed_at = now() WHERE ids[1] = $1::uuid", ids[0]
    )


async def claim_hot(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    """A claim batch, and the jobs' rows marked claimed by a HOT update (no index names what it
    changes): every reader of a job's state reads its row as today."""
    await claim_batch(connection, ids)
    await connection.execute(
        """
        UPDATE jobs_next SET state = 'dispatching', publish_attempts = publish_attempts + 1,
            updated_at = now()
        WHERE id = ANY($1::uuid[])
        """,
        ids,
    )


async def confirm_hot(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    """The rows marked dispatched (HOT), the claim batch gone."""
    await confirm_row(connection, ids)
    await connection.execute("DELETE FROM claim_batches WHERE ids[1] = $1::uuid", ids[0])


EVENT_BATCH = """
INSERT INTO event_batches (event_ids, job_ids, outcomes, attempts, consumers, ats{ms_column})
SELECT array_agg(gen_random_uuid()), array_agg(id), array_agg($2::text), array_agg(1),
       array_agg('c1'::text), array_agg(now()){ms_value}
FROM unnest($1::uuid[]) AS id
"""


async def event_batch(connection: asyncpg.Connection, ids: list[uuid.UUID], outcome: str) -> None:
    keyed = await connection.fetchval(
        "SELECT count(*) > 0 FROM pg_attribute WHERE attrelid = 'event_batches'::regclass"
        " AND attname = 'job_ms'"
    )
    if not keyed:
        await connection.execute(EVENT_BATCH.format(ms_column="", ms_value=""), ids, outcome)
        return
    ms = sorted({job_id.int >> 80 for job_id in ids})  # a UUIDv7's 48-bit Unix milliseconds
    statement = EVENT_BATCH.format(ms_column=", job_ms", ms_value=", $3::bigint[]")
    await connection.execute(statement, ids, outcome, ms)


async def started_batch(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    await event_batch(connection, ids, "started")


def final_batch(*, leaves_due: bool) -> Step:
    """The ``succeeded`` events as one row and the outcome as one update: HOT, or the write
    that takes the job out of the due index."""
    pending = ", pending = false" if leaves_due else ""

    async def final(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
        await event_batch(connection, ids, "succeeded")
        await connection.execute(
            f"UPDATE jobs_next SET state = 'succeeded', updated_at = now(){pending}"
            " WHERE id = ANY($1::uuid[])",
            ids,
        )

    return final


@dataclass(frozen=True)
class Design:
    name: str
    what: str
    schema: str  # "" for the migrations' schema
    steps: tuple[Step, Step, Step, Step, Step]  # insert, claim, confirm, started, final


# Due entries apart, claims a row a batch, the one update when the job settles.
PENDING_STEPS: tuple[Step, Step, Step, Step, Step] = (
    insert_next_pending,
    claim_batch,
    confirm_batch,
    started_batch,
    final_batch(leaves_due=False),
)

# The chosen design's schema (docs/development/job-storage.md), the refined ones built on it.
PENDING_MS = JOBS_HOT + PENDING_TABLE + EVENT_BATCHES + EVENTS_BY_JOB_MS + CLAIM_BATCHES

DESIGNS = (
    Design(
        "today",
        "the migrations' schema; a row version for claim, confirm and outcome; event batches",
        "",
        (insert_today, claim_today, confirm_today, started_today, final_today),
    ),
    Design(
        "hot",
        "due index on a pending flag: the claim not HOT, confirm and outcome HOT; event batches",
        JOBS_HOT + DUE_ON_PENDING + EVENT_BATCHES,
        (insert_next, claim_row, confirm_row, started_batch, final_batch(leaves_due=False)),
    ),
    Design(
        "hot+gin",
        "hot, and a GIN index finding a job's events",
        JOBS_HOT + DUE_ON_PENDING + EVENT_BATCHES + EVENTS_BY_JOB,
        (insert_next, claim_row, confirm_row, started_batch, final_batch(leaves_due=False)),
    ),
    Design(
        "pending+ms",
        "pending-table, and a GIN index on the milliseconds of each batch's job ids",
        PENDING_MS,
        PENDING_STEPS,
    ),
    Design(
        "pending+rest",
        "pending+ms, with the rare states' index and the pending entries' id index",
        PENDING_MS + REST_AND_PENDING_IDS,
        PENDING_STEPS,
    ),
    Design(
        "pending+rest+lock",
        "pending+rest, the claim share-locking its jobs' rows",
        PENDING_MS + REST_AND_PENDING_IDS,
        (insert_next_pending, claim_batch_locking, *PENDING_STEPS[2:]),
    ),
    Design(
        "due-every-job",
        "pending+rest without the pending table: one due index over every job, no predicate",
        JOBS_HOT + EVENT_BATCHES + EVENTS_BY_JOB_MS + CLAIM_BATCHES + DUE_EVERY_JOB,
        (insert_next, *PENDING_STEPS[1:]),
    ),
    Design(
        "hot-claims",
        "due-every-job's indexes; claim, confirm and outcome each a HOT update; a claim batch"
        " row while in flight",
        JOBS_HOT + EVENT_BATCHES + EVENTS_BY_JOB_MS + CLAIM_BATCHES + DUE_EVERY_JOB,
        (insert_next, claim_hot, confirm_hot, started_batch, final_batch(leaves_due=False)),
    ),
    Design(
        "batch-then-hot",
        "due-every-job's indexes; the claim a batch row, confirm and outcome each a HOT update",
        JOBS_HOT + EVENT_BATCHES + EVENTS_BY_JOB_MS + CLAIM_BATCHES + DUE_EVERY_JOB,
        (insert_next, claim_batch, confirm_hot, started_batch, final_batch(leaves_due=False)),
    ),
    Design(
        "claim-batches",
        "claims and confirms a row a batch; the outcome the one write, leaving the due index",
        JOBS_HOT + DUE_ON_PENDING + EVENT_BATCHES + CLAIM_BATCHES,
        (insert_next, claim_batch, confirm_batch, started_batch, final_batch(leaves_due=True)),
    ),
    Design(
        "pending-table",
        "due entries in a table of their own (truncated, not deleted): every update HOT",
        JOBS_HOT + PENDING_TABLE + EVENT_BATCHES + CLAIM_BATCHES,
        PENDING_STEPS,
    ),
)


async def measure(
    server: PostgresServer, design: Design, jobs: int, batch: int, fillfactor: int
) -> storage.Cost:
    server.create_database(design.name)
    dsn = server.dsn(design.name)
    if design.schema:
        connection = await asyncpg.connect(dsn)
        await connection.execute(design.schema.replace("{fillfactor}", str(fillfactor)))
        await connection.close()
    else:
        from dispatcher.store.migrate import apply_migrations

        await apply_migrations(dsn)
    connection = await asyncpg.connect(dsn)
    try:
        before = await storage.read(dsn)
        made = JobIds()  # time-ordered, as the dispatcher's
        for _ in range(jobs // batch):
            ids = [made.next() for _ in range(batch)]
            for step in design.steps:
                async with connection.transaction():
                    await step(connection, ids)
        after = await storage.read(dsn)
    finally:
        await connection.close()
    return storage.cost(before, after, jobs // batch * batch, server.data / "pg_wal")


async def main(jobs: int, batch: int, only: list[str], fillfactor: int) -> None:
    root = service_root("bench-designs")
    server = PostgresServer(root, reserve_port(), settings=QUEUE_SETTINGS)
    server.start()
    results: dict[str, object] = {"jobs": jobs, "batch": batch, "fillfactor": fillfactor}
    try:
        for design in DESIGNS:
            if only and design.name not in only:
                continue
            cost = await measure(server, design, jobs, batch, fillfactor)
            results[design.name] = cost.figures()
            print(f"{design.name}: {design.what}")
            print("\n".join(f"  {line}" for line in cost.lines()), flush=True)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"  written to {harness.write('storage_designs', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--only", nargs="*", default=[])
    # A batch's rows share pages, and a statement updates them all at once: each new version
    # needs room on the page beside the old one (still live to that statement) to be HOT.
    parser.add_argument("--fillfactor", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.batch, args.only, args.fillfactor))
