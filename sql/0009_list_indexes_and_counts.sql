-- 0009: housekeeping that scales with the table. GET /v1/jobs pages in id order under each filter
-- from an index instead of walking the primary key past every row that does not match (the rows a
-- filter asks for are often the newest: scheduled jobs, a tenant that started last week); and the
-- job counts are taken by one node at a time into a small table every node reads, instead of a
-- full GROUP BY on every node each round.
--
-- The indexes are built inside the migration's transaction, so job inserts wait for them (a few
-- seconds per million jobs in all; see README "Upgrading"). IF NOT EXISTS lets an operator build them
-- beforehand with CREATE INDEX CONCURRENTLY under the same names and skip that wait.

-- A state in id order. The namespace and routing key are carried so that a tenant's filter or a
-- routing key is checked in the index alone (the list query asks it for ids only), and so that a
-- state's jobs are counted per routing key from its range of the index alone.
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, id) INCLUDE (namespace, routing_key);

-- A routing key in id order, as before, now carrying the state and namespace so that those filters
-- are checked in the index alone too (it replaces jobs_routing_key, the same keys without them).
CREATE INDEX IF NOT EXISTS jobs_key ON jobs (routing_key, id) INCLUDE (state, namespace);
DROP INDEX IF EXISTS jobs_routing_key;

-- A named namespace in id order. Partial: the default namespace (NULL) is listed through the
-- primary key, and an installation without namespaces pays nothing for this index.
CREATE INDEX IF NOT EXISTS jobs_namespace ON jobs (namespace, id) WHERE namespace IS NOT NULL;

-- The same uniqueness as before (a key once per namespace), the key first, so that looking a key
-- up in every namespace (an admin's ?idempotency_key=) is an index lookup too. ON CONFLICT names
-- the columns, not the index, and matches them in any order.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency_key_namespace
    ON jobs (idempotency_key, (coalesce(namespace, ''))) WHERE idempotency_key IS NOT NULL;
DROP INDEX IF EXISTS jobs_idempotency_key;

-- The last count of each state: its top routing keys by jobs (most first) and the rest summed,
-- so a row stays small whatever the number of keys. count_s is how long the count took: a state
-- is recounted less often the longer its count takes (see dispatcher/housekeeping.py).
CREATE TABLE job_counts (
    state        text             PRIMARY KEY,
    routing_keys text[]           NOT NULL,
    jobs         bigint[]         NOT NULL,  -- per routing key, in the same order
    other_jobs   bigint           NOT NULL,  -- the jobs of every other routing key
    counted_at   timestamptz      NOT NULL,
    count_s      double precision NOT NULL
);
