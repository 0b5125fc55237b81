-- 0030: claims as rows (docs/development/job-storage.md, "Step 3 weighed again", change 1).
-- Each claim statement inserts one row: the node, the lease, the jobs it claimed, and each one's
-- shard and the epoch it was claimed under. The looks that find the claims whose lease ran out
-- (EXPIRED_LEASES) or that an older epoch made (ORPHANED_CLAIMS), and the pages and counts of
-- dispatching jobs, read these rows instead of jobs_lease_until, which goes: every claim wrote an
-- entry in it, and its range of lease ends is what a held snapshot filled.
--
-- The job's row still says dispatching, with its lease, epoch and node, which the claim's own
-- test of a job in flight reads. A job is in flight under a claim while its row is dispatching
-- with that claim's lease and node: a confirm, a release, an expiry or a park ends that (they
-- clear the row's lease), and so does a later claim of the job (a lease of its own). Housekeeping
-- deletes the claims none of whose jobs is in flight under them any more.

CREATE TABLE claims (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    made_at timestamptz NOT NULL DEFAULT now(),
    node text,
    lease_until timestamptz NOT NULL,
    ids uuid[] NOT NULL,
    shards integer[] NOT NULL,  -- each job's shard, in the order of ids
    epochs bigint[] NOT NULL    -- the epoch of that shard each job was claimed under
);
CREATE INDEX claims_lease_until ON claims (lease_until);

-- The jobs in flight as the nodes stopped: a row for each claim that made them (one node, one
-- lease end: one claim statement).
INSERT INTO claims (node, lease_until, ids, shards, epochs)
SELECT claimed_by, lease_until, array_agg(id ORDER BY id), array_agg(shard ORDER BY id),
       array_agg(coalesce(claim_epoch, 0) ORDER BY id)
FROM jobs
WHERE lease_until IS NOT NULL AND state = 'dispatching'
GROUP BY claimed_by, lease_until;

DROP INDEX jobs_lease_until;

-- The claim (scheduler.CLAIM_JOBS) as 0029 made it, and its row in claims.
CREATE OR REPLACE FUNCTION dispatcher_claim_v1(
    wanted_ids uuid[], held_shards integer[], held_epochs bigint[], node text, lease_s float8,
    entry_run_ats float8[], fence_s float8, held_rules jsonb, held_words text[], granted uuid[]
) RETURNS TABLE (fenced_at_s float8, answered_at_s float8, id uuid, shard integer,
                 routing_key text, payload bytea, run_at timestamptz, idempotency_key text,
                 headers jsonb, priority smallint, ttl_ms bigint, dispatch_round uuid,
                 namespace text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    read_at constant timestamptz := clock_timestamp();
    fenced integer[];
BEGIN
    SELECT coalesce(array_agg(f.shard), '{}') INTO fenced
    FROM (
        SELECT se.shard FROM shard_epochs se
        JOIN unnest(held_shards, held_epochs) AS held(shard, epoch)
          ON se.shard = held.shard AND se.epoch = held.epoch
        ORDER BY se.shard
        FOR SHARE OF se
    ) AS f;
    -- Each id looked up by the primary key: the fence is one array, never a relation joined.
    RETURN QUERY
    WITH claimed AS (
        UPDATE jobs j
        SET state = 'dispatching', lease_until = now() + make_interval(secs => lease_s),
            claim_epoch = held_epochs[array_position(held_shards, j.shard)], claimed_by = node,
            publish_attempts = j.publish_attempts + 1, updated_at = now(),
            dispatch_round = coalesce(j.dispatch_round, gen_random_uuid())
        FROM unnest(wanted_ids, entry_run_ats) AS wanted(id, run_at_s)
        WHERE j.id = wanted.id
          AND j.run_at <= to_timestamp(wanted.run_at_s) + interval '1 millisecond'
          AND j.run_at <= read_at + make_interval(secs => fence_s)
          AND j.shard = ANY (fenced)
          AND CASE j.state
                WHEN 'scheduled' THEN j.id = ANY (granted)
                    OR cardinality(held_words) = 0
                    OR split_part(j.routing_key, '.', 1) <> ALL (held_words)
                    OR NOT dispatcher_flow_held(j.routing_key, j.namespace, held_rules)
                WHEN 'dispatching' THEN j.lease_until < now()
                    OR j.claim_epoch < held_epochs[array_position(held_shards, j.shard)]
                ELSE false
              END
        RETURNING j.id, j.shard, j.routing_key, j.payload, j.run_at, j.idempotency_key,
                  j.headers, j.priority, j.ttl_ms, j.dispatch_round, j.namespace,
                  j.lease_until AS leased_to
    ), recorded AS (  -- run whether or not it is read, as every data-modifying WITH is
        INSERT INTO claims (node, lease_until, ids, shards, epochs)
        SELECT dispatcher_claim_v1.node, max(c.leased_to), array_agg(c.id), array_agg(c.shard),
               array_agg(held_epochs[array_position(held_shards, c.shard)])
        FROM claimed c
        HAVING count(*) > 0
    )
    SELECT extract(epoch FROM read_at)::float8, extract(epoch FROM clock_timestamp())::float8,
           c.id, c.shard, c.routing_key, c.payload, c.run_at, c.idempotency_key, c.headers,
           c.priority, c.ttl_ms, c.dispatch_round, c.namespace
    FROM (VALUES (1)) AS one(n) LEFT JOIN claimed c ON true;
END
$$;
