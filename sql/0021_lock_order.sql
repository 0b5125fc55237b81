-- 0021: rows locked in id order wherever one statement locks several jobs, so that two such
-- statements (a claim's batch, a bulk action's, a batch of submits that replace or extend the
-- jobs their keys name) wait for each other's rows at most in turn, never in a cycle.
--
-- dispatcher_enqueue_v2 as 0019 made it, but for the lock taken before its change of the
-- pending jobs the keys name: its UPDATE locked them in the order the join met them, which is
-- the order a batch gives. Same arguments, same answers.
CREATE OR REPLACE FUNCTION dispatcher_enqueue_v2(
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
    todo integer[] := ARRAY(SELECT generate_series(1, coalesce(cardinality(job_ids), 0)));
    ids uuid[] := array_fill(NULL::uuid, ARRAY[size]);
    created timestamptz[] := array_fill(NULL::timestamptz, ARRAY[size]);
    due timestamptz[] := array_fill(NULL::timestamptz, ARRAY[size]);
    outcomes text[] := array_fill(NULL::text, ARRAY[size]);
    hows constant text[] :=  -- NULL (the whole array or one element): keep
        ARRAY(SELECT coalesce(on_existing[t], 'keep') FROM generate_series(1, size) AS t);
    tries integer := 0;
    r record;
BEGIN
    IF EXISTS (SELECT FROM unnest(hows) AS h WHERE h NOT IN ('keep', 'replace', 'extend')) THEN
        RAISE EXCEPTION 'on_existing is keep, replace or extend' USING ERRCODE = '22023';
    END IF;
    WHILE cardinality(todo) > 0 LOOP
        tries := tries + 1;
        IF tries > 10 THEN  -- each try follows a key let go of meanwhile: never in practice
            RAISE EXCEPTION 'idempotency keys kept changing hands' USING ERRCODE = '40001';
        END IF;
        FOR r IN
            WITH inserted AS (
                INSERT INTO jobs (id, shard, routing_key, payload, headers, priority, ttl_ms,
                                  idempotency_key, run_at, namespace, key_release)
                SELECT n.id,
                       coalesce(n.shard,
                                (n.id_hash % (SELECT count(*) FROM shard_epochs))::integer),
                       n.routing_key, n.payload, n.headers, n.priority, n.ttl_ms,
                       n.idempotency_key,
                       n.run_at, n.namespace, n.key_release
                FROM unnest(job_ids, job_shards, id_hashes, routing_keys, payloads, job_headers,
                            priorities, ttls_ms, idempotency_keys, run_ats, namespaces,
                            key_releases)
                     WITH ORDINALITY
                     AS n(id, shard, id_hash, routing_key, payload, headers, priority, ttl_ms,
                          idempotency_key, run_at, namespace, key_release, ordinal)
                WHERE n.ordinal = ANY (todo)
                ON CONFLICT ((coalesce(namespace, '')), idempotency_key)
                    WHERE idempotency_key IS NOT NULL
                DO NOTHING
                RETURNING jobs.id, jobs.shard, jobs.run_at, jobs.routing_key, jobs.created_at
            )  -- each row's element, by its id: one hash join, not a search of the array a row
            SELECT i.*, e.ordinal
            FROM inserted i JOIN unnest(job_ids) WITH ORDINALITY AS e(id, ordinal) ON e.id = i.id
        LOOP
            ids[r.ordinal] := r.id;
            created[r.ordinal] := r.created_at;
            due[r.ordinal] := r.run_at;
            outcomes[r.ordinal] := 'created';
            IF notify THEN
                PERFORM dispatcher_notify_due_v1(r.id, r.shard, r.run_at, r.routing_key);
            END IF;
        END LOOP;
        todo := ARRAY(SELECT t FROM unnest(todo) AS t WHERE outcomes[t] IS NULL);
        -- The pending jobs the others' keys name, changed as asked: locked first in id order,
        -- as every statement locking several jobs takes them (a claim's, a bulk action's), so
        -- that two of them waiting for each other's rows cannot deadlock.
        PERFORM FROM jobs j
        JOIN unnest(idempotency_keys, namespaces, hows) WITH ORDINALITY
             AS n(idempotency_key, namespace, how, ordinal)
          ON j.idempotency_key = n.idempotency_key
         AND coalesce(j.namespace, '') = coalesce(n.namespace, '')
        WHERE n.ordinal = ANY (todo) AND n.how IN ('replace', 'extend')
        ORDER BY j.id
        FOR UPDATE OF j;
        FOR r IN
            WITH changed AS (
                UPDATE jobs j
                SET run_at = CASE WHEN n.how = 'extend' THEN greatest(j.run_at, n.run_at)
                                  ELSE n.run_at END,
                    payload = CASE WHEN n.how = 'replace' THEN n.payload ELSE j.payload END,
                    headers = CASE WHEN n.how = 'replace' THEN n.headers ELSE j.headers END,
                    priority = CASE WHEN n.how = 'replace' THEN n.priority ELSE j.priority END,
                    ttl_ms = CASE WHEN n.how = 'replace' THEN n.ttl_ms ELSE j.ttl_ms END,
                    updated_at = now()
                FROM unnest(routing_keys, payloads, job_headers, priorities, ttls_ms,
                            idempotency_keys, run_ats, namespaces, hows)
                     WITH ORDINALITY
                     AS n(routing_key, payload, headers, priority, ttl_ms, idempotency_key,
                          run_at, namespace, how, ordinal)
                WHERE n.ordinal = ANY (todo) AND n.how IN ('replace', 'extend')
                  AND j.idempotency_key = n.idempotency_key
                  AND coalesce(j.namespace, '') = coalesce(n.namespace, '')
                  AND j.state IN ('scheduled', 'waiting') AND j.routing_key = n.routing_key
                  AND (n.how = 'replace' OR n.run_at > j.run_at)
                RETURNING n.ordinal,
                          CASE n.how WHEN 'replace' THEN 'replaced' ELSE 'extended' END AS done,
                          j.id, j.shard, j.run_at, j.routing_key, j.created_at
            ), noted AS (
                INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group,
                                        consumer, at, detail)
                SELECT gen_random_uuid(), c.id, c.done, 0, 'dispatcher', actor, now(),
                       'run_at ' || to_char(c.run_at AT TIME ZONE 'UTC',
                                            'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                FROM changed c
            )
            SELECT * FROM changed
        LOOP
            ids[r.ordinal] := r.id;
            created[r.ordinal] := r.created_at;
            due[r.ordinal] := r.run_at;
            outcomes[r.ordinal] := r.done;
            PERFORM dispatcher_notify_due_v1(r.id, r.shard, r.run_at, r.routing_key);
        END LOOP;
        todo := ARRAY(SELECT t FROM unnest(todo) AS t WHERE outcomes[t] IS NULL);
        -- The rest are kept or refused, as the job their key names stands now; a key no job
        -- holds any more (let go of since the insert) is tried again.
        FOR r IN
            SELECT n.ordinal, j.id, j.created_at, j.run_at,
                   CASE WHEN n.how = 'keep' OR (j.state IN ('scheduled', 'waiting')
                                                AND j.routing_key = n.routing_key
                                                AND n.how = 'extend')
                        THEN 'kept' ELSE 'refused' END AS outcome
            FROM unnest(routing_keys, idempotency_keys, namespaces, hows)
                 WITH ORDINALITY AS n(routing_key, idempotency_key, namespace, how, ordinal)
            JOIN jobs j ON j.idempotency_key = n.idempotency_key
                       AND coalesce(j.namespace, '') = coalesce(n.namespace, '')
            WHERE n.ordinal = ANY (todo)
        LOOP
            ids[r.ordinal] := r.id;
            created[r.ordinal] := r.created_at;
            due[r.ordinal] := r.run_at;
            outcomes[r.ordinal] := r.outcome;
        END LOOP;
        todo := ARRAY(SELECT t FROM unnest(todo) AS t WHERE outcomes[t] IS NULL);
    END LOOP;
    RETURN QUERY
    SELECT t::integer, ids[t], created[t], due[t], outcomes[t]
    FROM generate_series(1, size) AS t;
END
$$;

