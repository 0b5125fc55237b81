-- 0024: one insert for every batch the dispatcher stores. dispatcher_enqueue_v2 (0019, 0021)
-- answers what v1 (0012) does and more (replace, extend, key releases), but it settled each job
-- in a loop of its own, and filtered each statement's rows with "ordinal = ANY (todo)", a search
-- of a batch-long array per row: a batch of new jobs went through it 14% slower than v1, so the
-- dispatcher kept v1 beside it for batches without those levers, and a fallback between them.
-- v3 takes v2's arguments and gives v2's answers, settling each step's jobs as one set: the rows
-- still unsettled are a boolean array read by index, each step's answers are gathered into
-- arrays, and a batch whose jobs are all new is settled by its INSERT alone. v1 and v2 stay for
-- the programs that call them (the SDK's enqueue, nodes older than this migration).
--
-- Jobs from parallel arrays, one element per job, as v2 (0019) describes them. Each is inserted;
-- or, when its idempotency key names a job in its namespace, that pending job is replaced or its
-- run_at extended as on_existing asks (the change noted in its history with ACTOR), else the job
-- is kept or refused. A key let go of between the insert and the read is tried again. Returns one
-- row per job, in the order given: its ordinal, the id that answers it, created_at, run_at, and
-- the outcome (created, replaced, extended, kept, refused).
CREATE FUNCTION dispatcher_enqueue_v3(
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
                ), noted AS (
                    INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group,
                                            consumer, at, detail)
                    SELECT gen_random_uuid(), c.id, c.done, 0, 'dispatcher', actor, now(),
                           'run_at ' || to_char(c.run_at AT TIME ZONE 'UTC',
                                                'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                    FROM changed c
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
