-- 0029: the fence between a claim and the statements that change a pending job (a cancel, a
-- reschedule, a bulk batch, a replace or an extend) moves from the job's row to its shard's row
-- of shard_epochs (docs/development/job-storage.md, step 3). A claim takes its shards' rows FOR
-- SHARE, a change FOR NO KEY UPDATE; each in a statement of its own, in shard order, before it
-- reads the jobs, so that it reads them in a snapshot taken once it holds the fence: it sees
-- every change the other committed before, and the other cannot start on those shards until it
-- commits. A claim still writes its jobs' rows today, whose locks would do alone; once claims are
-- a row a batch and write no job row, this fence is the one there is.
--
-- The takeover of a shard (a new epoch: an UPDATE of the row) waits for both, as it did for the
-- claims.

-- The claim (scheduler.CLAIM_JOBS): the statement that was its text, in two. First, PostgreSQL's
-- clock (the claim's fence in time: a job is claimed only once the clock read here is within
-- fence_s of its run_at) and the fence: the rows of the shards held under these epochs,
-- share-locked. Then, in a new snapshot, the jobs of these ids still due at their entry's time
-- (a job rescheduled later since is claimed by its new entry), on a fenced shard, and scheduled
-- and not held by a flow rule (the test shared.not_held makes: held_rules and held_words, both
-- empty when nothing is held; granted, the ids a meter let go), or claimed under a lease run out
-- or an older epoch (ORPHANED_CLAIMS). A job stored before 0011 gets its dispatch round here.
-- Each row: the clock read first and again as the answer is made (POSIX seconds), then the
-- claimed job's columns (models.Claimed's fields, in order); one row at least, the clocks
-- alone, when nothing was claimed.
CREATE FUNCTION dispatcher_claim_v1(
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
                  j.headers, j.priority, j.ttl_ms, j.dispatch_round, j.namespace
    )
    SELECT extract(epoch FROM read_at)::float8, extract(epoch FROM clock_timestamp())::float8,
           c.id, c.shard, c.routing_key, c.payload, c.run_at, c.idempotency_key, c.headers,
           c.priority, c.ttl_ms, c.dispatch_round, c.namespace
    FROM (VALUES (1)) AS one(n) LEFT JOIN claimed c ON true;
END
$$;

-- dispatcher_enqueue_v3 as 0025 made it, but for the fence its replace and extend take before
-- they read the jobs the keys name. Same arguments, same answers.
CREATE OR REPLACE FUNCTION dispatcher_enqueue_v3(
    job_ids uuid[], job_shards integer[], id_hashes bigint[], routing_keys text[],
    payloads bytea[], job_headers jsonb[], priorities smallint[], ttls_ms bigint[],
    idempotency_keys text[], run_ats timestamptz[], namespaces text[], key_releases text[],
    on_existing text[], notify boolean, actor text
) RETURNS TABLE (ordinal integer, id uuid, created_at timestamptz, run_at timestamptz,
                 outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    size constant integer := coalesce(cardinality(job_ids), 0);
    hows constant text[] :=  -- NULL (the whole array or one element): keep
        ARRAY(SELECT coalesce(on_existing[t], 'keep') FROM generate_series(1, size) AS t);
    changes constant boolean := 'replace' = ANY (hows) OR 'extend' = ANY (hows);
    unsettled boolean[] := array_fill(true, ARRAY[size]);  -- by ordinal: no answer yet
    left_over integer := size;
    tries integer := 0;
    -- Every answer so far, one element each, in the order they were settled.
    answered integer[] := '{}';
    answer_ids uuid[] := '{}';
    answer_created timestamptz[] := '{}';
    answer_due timestamptz[] := '{}';
    answer_outcomes text[] := '{}';
    -- One step's answers.
    step_ordinals integer[];
    step_ids uuid[];
    step_created timestamptz[];
    step_due timestamptz[];
    step_outcomes text[];
    t integer;
BEGIN
    IF EXISTS (SELECT FROM unnest(hows) AS h WHERE h NOT IN ('keep', 'replace', 'extend')) THEN
        RAISE EXCEPTION 'on_existing is keep, replace or extend' USING ERRCODE = '22023';
    END IF;
    WHILE left_over > 0 LOOP
        tries := tries + 1;
        IF tries > 10 THEN  -- each try follows a key let go of meanwhile: never in practice
            RAISE EXCEPTION 'idempotency keys kept changing hands' USING ERRCODE = '40001';
        END IF;
        FOR step IN 1..3 LOOP
            EXIT WHEN left_over = 0;
            CONTINUE WHEN step = 2 AND NOT changes;
            IF step = 1 THEN  -- insert; a key held in the namespace inserts nothing
                WITH inserted AS (
                    INSERT INTO jobs (id, shard, routing_key, payload, headers, priority, ttl_ms,
                                      idempotency_key, run_at, namespace, key_release)
                    SELECT n.id,
                           coalesce(n.shard,
                                    (n.id_hash % (SELECT count(*) FROM shard_epochs))::integer),
                           n.routing_key, n.payload, n.headers, n.priority, n.ttl_ms,
                           n.idempotency_key, n.run_at, n.namespace, n.key_release
                    FROM unnest(job_ids, job_shards, id_hashes, routing_keys, payloads,
                                job_headers, priorities, ttls_ms, idempotency_keys, run_ats,
                                namespaces, key_releases)
                         WITH ORDINALITY
                         AS n(id, shard, id_hash, routing_key, payload, headers, priority,
                              ttl_ms, idempotency_key, run_at, namespace, key_release, ordinal)
                    WHERE unsettled[n.ordinal]
                    ON CONFLICT ((coalesce(namespace, '')), idempotency_key)
                        WHERE idempotency_key IS NOT NULL
                    DO NOTHING
                    RETURNING jobs.id, jobs.shard, jobs.run_at, jobs.routing_key, jobs.created_at
                ), noticed AS (  -- one row, joined below: a CTE nobody reads would not run
                    SELECT count(dispatcher_notify_due_v1(i.id, i.shard, i.run_at,
                                                          i.routing_key)) AS sent
                    FROM inserted i WHERE notify
                )  -- each row's element, by its id: one hash join, not a search per row
                SELECT array_agg(e.ordinal::integer), array_agg(i.id), array_agg(i.created_at),
                       array_agg(i.run_at), array_agg('created'::text)
                INTO step_ordinals, step_ids, step_created, step_due, step_outcomes
                FROM inserted i
                JOIN unnest(job_ids) WITH ORDINALITY AS e(id, ordinal) ON e.id = i.id,
                     noticed;
            ELSIF step = 2 THEN
                -- The fence (above): the shards of the jobs the keys name, before any is read
                -- for its change, in shard order as every statement takes them.
                PERFORM FROM shard_epochs se
                WHERE se.shard IN (
                    SELECT j.shard FROM jobs j
                    JOIN unnest(idempotency_keys, namespaces, hows) WITH ORDINALITY
                         AS n(idempotency_key, namespace, how, ordinal)
                      ON j.idempotency_key = n.idempotency_key
                     AND coalesce(j.namespace, '') = coalesce(n.namespace, '')
                    WHERE unsettled[n.ordinal] AND n.how IN ('replace', 'extend'))
                ORDER BY se.shard
                FOR NO KEY UPDATE OF se;
                -- The pending jobs the others' keys name, changed as asked: locked first in id
                -- order, as every statement locking several jobs takes them (a claim's, a bulk
                -- action's), so that two of them waiting for each other's rows cannot deadlock.
                PERFORM FROM jobs j
                JOIN unnest(idempotency_keys, namespaces, hows) WITH ORDINALITY
                     AS n(idempotency_key, namespace, how, ordinal)
                  ON j.idempotency_key = n.idempotency_key
                 AND coalesce(j.namespace, '') = coalesce(n.namespace, '')
                WHERE unsettled[n.ordinal] AND n.how IN ('replace', 'extend')
                ORDER BY j.id
                FOR UPDATE OF j;
                WITH changed AS (
                    UPDATE jobs j
                    SET run_at = CASE WHEN n.how = 'extend' THEN greatest(j.run_at, n.run_at)
                                      ELSE n.run_at END,
                        payload = CASE WHEN n.how = 'replace' THEN n.payload ELSE j.payload END,
                        headers = CASE WHEN n.how = 'replace' THEN n.headers ELSE j.headers END,
                        priority = CASE WHEN n.how = 'replace' THEN n.priority
                                        ELSE j.priority END,
                        ttl_ms = CASE WHEN n.how = 'replace' THEN n.ttl_ms ELSE j.ttl_ms END,
                        updated_at = now()
                    FROM unnest(routing_keys, payloads, job_headers, priorities, ttls_ms,
                                idempotency_keys, run_ats, namespaces, hows)
                         WITH ORDINALITY
                         AS n(routing_key, payload, headers, priority, ttl_ms, idempotency_key,
                              run_at, namespace, how, ordinal)
                    WHERE unsettled[n.ordinal] AND n.how IN ('replace', 'extend')
                      AND j.idempotency_key = n.idempotency_key
                      AND coalesce(j.namespace, '') = coalesce(n.namespace, '')
                      AND j.state IN ('scheduled', 'waiting') AND j.routing_key = n.routing_key
                      AND (n.how = 'replace' OR n.run_at > j.run_at)
                    RETURNING n.ordinal,
                              CASE n.how WHEN 'replace' THEN 'replaced' ELSE 'extended' END
                                  AS done,
                              j.id, j.shard, j.run_at, j.routing_key, j.created_at
                ), noted AS (  -- one event batch, as every statement's changes
                    INSERT INTO event_batches (job_keys, event_ids, job_ids, outcomes, attempts,
                                               consumer_groups, consumers, errors, ats, rounds,
                                               ignored, details)
                    SELECT array_agg(DISTINCT dispatcher_id_key(c.id)),
                           array_agg(gen_random_uuid()), array_agg(c.id), array_agg(c.done),
                           array_agg(0), array_agg('dispatcher'::text), array_agg(actor),
                           array_agg(NULL::text), array_agg(now()), array_agg(NULL::uuid),
                           array_agg(NULL::text),
                           array_agg('run_at ' || to_char(c.run_at AT TIME ZONE 'UTC',
                                                          'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
                    FROM changed c
                    HAVING count(*) > 0
                ), noticed AS (  -- a changed job's owner may hold its old time in memory
                    SELECT count(dispatcher_notify_due_v1(c.id, c.shard, c.run_at,
                                                          c.routing_key)) AS sent
                    FROM changed c
                )
                SELECT array_agg(c.ordinal::integer), array_agg(c.id), array_agg(c.created_at),
                       array_agg(c.run_at), array_agg(c.done)
                INTO step_ordinals, step_ids, step_created, step_due, step_outcomes
                FROM changed c, noticed;
            ELSE
                -- The rest are kept or refused, as the job their key names stands now; a key
                -- no job holds any more (let go of since the insert) is tried again.
                SELECT array_agg(n.ordinal::integer), array_agg(j.id), array_agg(j.created_at),
                       array_agg(j.run_at),
                       array_agg(CASE WHEN n.how = 'keep'
                                           OR (j.state IN ('scheduled', 'waiting')
                                               AND j.routing_key = n.routing_key
                                               AND n.how = 'extend')
                                      THEN 'kept' ELSE 'refused' END)
                INTO step_ordinals, step_ids, step_created, step_due, step_outcomes
                FROM unnest(routing_keys, idempotency_keys, namespaces, hows)
                     WITH ORDINALITY AS n(routing_key, idempotency_key, namespace, how, ordinal)
                JOIN jobs j ON j.idempotency_key = n.idempotency_key
                           AND coalesce(j.namespace, '') = coalesce(n.namespace, '')
                WHERE unsettled[n.ordinal];
            END IF;
            CONTINUE WHEN step_ordinals IS NULL;  -- no row: array_agg of nothing
            answered := answered || step_ordinals;
            answer_ids := answer_ids || step_ids;
            answer_created := answer_created || step_created;
            answer_due := answer_due || step_due;
            answer_outcomes := answer_outcomes || step_outcomes;
            left_over := left_over - cardinality(step_ordinals);
            IF left_over > 0 THEN
                FOREACH t IN ARRAY step_ordinals LOOP
                    unsettled[t] := false;
                END LOOP;
            END IF;
        END LOOP;
    END LOOP;
    RETURN QUERY
    SELECT a.ordinal, a.id, a.created_at, a.run_at, a.outcome
    FROM unnest(answered, answer_ids, answer_created, answer_due, answer_outcomes)
         AS a(ordinal, id, created_at, run_at, outcome)
    ORDER BY a.ordinal;
END
$$;

