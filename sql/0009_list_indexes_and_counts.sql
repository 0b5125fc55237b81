-- 0009: GET /v1/jobs pages in id order under each filter from an index, instead of walking the
-- primary key past every row that does not match (the rows a filter asks for are often the
-- newest: scheduled jobs, a tenant that started last week).
--
-- The indexes are built inside the migration's transaction, so job inserts wait for them (about
-- 2 s per million jobs in all; see README "Upgrading"). IF NOT EXISTS lets an operator build them
-- beforehand with CREATE INDEX CONCURRENTLY under the same names and skip that wait.

-- A state in id order. The namespace and routing key are carried so that a tenant's filter or a
-- routing key is checked in the index alone (the list query asks it for ids only).
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, id) INCLUDE (namespace, routing_key);

-- A named namespace in id order. Partial: the default namespace (NULL) is listed through the
-- primary key, and an installation without namespaces pays nothing for this index.
CREATE INDEX IF NOT EXISTS jobs_namespace ON jobs (namespace, id) WHERE namespace IS NOT NULL;

-- The same uniqueness as before (a key once per namespace), the key first, so that looking a key
-- up in every namespace (an admin's ?idempotency_key=) is an index lookup too. ON CONFLICT names
-- the columns, not the index, and matches them in any order.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency_key_namespace
    ON jobs (idempotency_key, (coalesce(namespace, ''))) WHERE idempotency_key IS NOT NULL;
DROP INDEX IF EXISTS jobs_idempotency_key;
