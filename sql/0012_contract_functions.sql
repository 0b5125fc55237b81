-- 0012: the database contract other programs rely on, behind versioned functions.
--
-- Job rows were written by two packages (the dispatcher's batch insert and the SDK's enqueue,
-- which applications upgrade on their own days), and the due notice's text was built in four
-- statements and parsed in a fifth place. Now dispatcher_enqueue_v1 is the one insert and
-- dispatcher_notify_due_v1 the one place that formats the notice; every caller goes through them
-- (the notice is parsed by dispatcher/store/due_notices.py). A change of either makes a _v2 beside
-- the _v1, which stays for the programs not yet upgraded.
--
-- No column changes here: an older SDK's own statement (INSERT INTO jobs ... RETURNING
-- pg_notify('dispatcher_due', ...)) still works against this schema, and its notices still parse.

-- Tell every dispatcher node that a job is scheduled (delivered on commit only), so that the one
-- owning its shard puts it on its heap if it falls inside the window already loaded there.
-- The text is 'id,shard,run_at as epoch seconds,routing key' (a routing key has no comma; a NULL
-- one is left out with its comma).
CREATE FUNCTION dispatcher_notify_due_v1(
    job_id uuid, job_shard integer, job_run_at timestamptz, job_routing_key text
) RETURNS void
LANGUAGE sql AS $$
SELECT pg_notify('dispatcher_due',
                 job_id::text || ',' || job_shard || ',' || extract(epoch FROM job_run_at)
                 || coalesce(',' || job_routing_key, ''))
$$;

-- Insert jobs in one statement from parallel arrays, one element per job. An idempotency key seen
-- before in the namespace inserts (and notifies) nothing: that job is not returned.
-- job_shards: the shard of each job, or NULL to choose it from id_hashes (the CRC-32 of the id's
-- 16 bytes, consumers_sdk.ids.id_hash) modulo the number of shards, as the dispatcher chooses for
-- a job not due soon; with no shards at all that choice raises division_by_zero.
-- headers: JSON objects; namespaces: NULL for the default one; notify: a due notice for each job
-- inserted (the dispatcher passes false: it puts its own jobs on its heap itself).
-- Returns each job inserted: id, created_at, run_at.
-- PL/pgSQL for its plan cache only (one set-based statement, no loop): a SQL function's body is
-- planned at every call, which cost a one-job insert a third of its rate.
CREATE FUNCTION dispatcher_enqueue_v1(
    job_ids uuid[], job_shards integer[], id_hashes bigint[], routing_keys text[],
    payloads bytea[], job_headers jsonb[], priorities smallint[], ttls_ms bigint[],
    idempotency_keys text[], run_ats timestamptz[], namespaces text[], notify boolean
) RETURNS TABLE (id uuid, created_at timestamptz, run_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH inserted AS (
    INSERT INTO jobs (id, shard, routing_key, payload, headers, priority, ttl_ms, idempotency_key,
                      run_at, namespace)
    SELECT n.id, coalesce(n.shard, (n.id_hash % (SELECT count(*) FROM shard_epochs))::integer),
           n.routing_key, n.payload, n.headers, n.priority, n.ttl_ms, n.idempotency_key,
           n.run_at, n.namespace
    FROM unnest(job_ids, job_shards, id_hashes, routing_keys, payloads, job_headers, priorities,
                ttls_ms, idempotency_keys, run_ats, namespaces)
         AS n(id, shard, id_hash, routing_key, payload, headers, priority, ttl_ms,
              idempotency_key, run_at, namespace)
    ON CONFLICT ((coalesce(namespace, '')), idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING jobs.id, jobs.shard, jobs.run_at, jobs.routing_key, jobs.created_at
), noticed AS (  -- one row, joined below: a CTE nobody reads would not run
    SELECT count(dispatcher_notify_due_v1(i.id, i.shard, i.run_at, i.routing_key))
    FROM inserted i WHERE notify
)
SELECT i.id, i.created_at, i.run_at FROM inserted i, noticed;
END
$$;

-- 0010's follow-up, unchanged but for its notice (dispatcher_notify_due_v1). 0006's trigger
-- function built the notice too; 0010 replaced it by one that calls this function.
CREATE OR REPLACE FUNCTION dispatcher_follow_dependents(
    prerequisite uuid, reached text, reached_at timestamptz, after_job uuid, batch_size integer
) RETURNS TABLE (followed bigint, last_job_id uuid, released bigint, cancelled bigint)
LANGUAGE sql AS $$
WITH edges AS (
    SELECT job_id FROM job_dependencies
    WHERE prerequisite_id = prerequisite AND job_id > after_job
    ORDER BY job_id
    LIMIT batch_size
), satisfied AS (
    UPDATE job_dependencies d SET satisfied = true
    FROM edges
    WHERE reached = 'succeeded' AND d.prerequisite_id = prerequisite AND d.job_id = edges.job_id
      AND NOT d.satisfied
    RETURNING d.job_id
), released AS (
    UPDATE jobs j
    SET waiting_for = j.waiting_for - 1,
        state = CASE WHEN j.waiting_for = 1 THEN 'scheduled' ELSE j.state END,
        updated_at = now()
    FROM satisfied
    WHERE j.id = satisfied.job_id AND j.state = 'waiting'
    RETURNING j.id, j.shard, j.run_at, j.state, j.routing_key
), cancelled AS (
    UPDATE jobs j
    SET state = 'cancelled', last_error = 'prerequisite ' || prerequisite || ' ' || reached,
        updated_at = now()
    FROM edges
    WHERE reached <> 'succeeded' AND j.id = edges.job_id AND j.state = 'waiting'
      AND j.created_at <= reached_at
    RETURNING j.id
)
SELECT (SELECT count(*) FROM edges),
       (SELECT job_id FROM edges ORDER BY job_id DESC LIMIT 1),
       (SELECT count(dispatcher_notify_due_v1(released.id, released.shard, released.run_at,
                                              released.routing_key))
        FROM released WHERE released.state = 'scheduled'),
       (SELECT count(*) FROM cancelled)
$$;
