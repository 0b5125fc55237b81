-- 0025: consumers' events and the dispatcher's notes stored a batch to a row. job_events kept a
-- row per event with two indexes: two rows and four index entries for every job a consumer
-- reported on (started, then succeeded), about a fifth of the WAL a job cost. event_batches keeps
-- one row for each batch of events a statement records (a delivery of consumers' events, a
-- parked batch, a bulk action's batch, a submit's replaced or extended jobs), its columns arrays
-- in the order received, and one index: a GIN over the keys of its job ids (dispatcher_id_key:
-- the millisecond a UUIDv7 was made in, and the top of its counter). Jobs made together are
-- fired together, mostly: a batch names a few keys, not an entry per job. A job's events are
-- read from the batches its key names, its own found in their arrays.
--
-- The order received is the batch's id, then the position in its arrays. Nothing on the paths
-- of a job reads event batches: a redelivered event is stored again (a job's history reads each
-- event id once), the outcome reported while a job is still dispatching waits on its row
-- (jobs.reported), and the ignored events kept are counted there (jobs.ignored_kept).

-- A job id's first 56 bits: for a UUIDv7, the millisecond it was made in, its version, and the
-- top four bits of the counter that orders the ids of one millisecond (sixteen keys share a
-- millisecond's ids: a batch of thousands made at once is not one key). For any other uuid, as
-- good a key.
CREATE FUNCTION dispatcher_id_key(id uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ('x' || encode(substring(uuid_send(id) FROM 1 FOR 7), 'hex'))::bit(56)::bigint;

-- No event is recorded into job_events from here on (an older node's recording, a replace through
-- the old v2 waits, then fails and is retried: nothing recorded meanwhile is left behind).
LOCK TABLE job_events IN EXCLUSIVE MODE;

CREATE TABLE event_batches (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    job_keys          bigint[]    NOT NULL,  -- dispatcher_id_key of job_ids, each once
    -- One element per event, in the order received; errors, rounds, ignored and details hold
    -- NULL where an event has none (as job_events' columns did).
    event_ids       uuid[]        NOT NULL,
    job_ids         uuid[]        NOT NULL,
    outcomes        text[]        NOT NULL,
    attempts        integer[]     NOT NULL,
    consumer_groups text[]        NOT NULL,
    consumers       text[]        NOT NULL,
    errors          text[]        NOT NULL,
    ats             timestamptz[] NOT NULL,  -- when the consumer saw it (or the dispatcher did)
    rounds          uuid[]        NOT NULL,  -- the dispatch round the event names
    ignored         text[]        NOT NULL,  -- why it changed nothing (NULL: it counted)
    details         text[]        NOT NULL,  -- a dispatcher's change: the new time, the action
    CONSTRAINT event_batches_aligned CHECK (
        cardinality(event_ids) > 0
        AND cardinality(job_ids) = cardinality(event_ids)
        AND cardinality(outcomes) = cardinality(event_ids)
        AND cardinality(attempts) = cardinality(event_ids)
        AND cardinality(consumer_groups) = cardinality(event_ids)
        AND cardinality(consumers) = cardinality(event_ids)
        AND cardinality(errors) = cardinality(event_ids)
        AND cardinality(ats) = cardinality(event_ids)
        AND cardinality(rounds) = cardinality(event_ids)
        AND cardinality(ignored) = cardinality(event_ids)
        AND cardinality(details) = cardinality(event_ids)),
    CONSTRAINT event_batches_outcomes_known CHECK (
        outcomes <@ ARRAY['started', 'succeeded', 'failed', 'dead', 'requeued', 'dispatched',
                          'replaced', 'extended', 'rescheduled', 'cancelled']),
    CONSTRAINT event_batches_ignored_known CHECK (
        array_remove(ignored, NULL)
            <@ ARRAY['other_round', 'no_round', 'routing_key', 'no_user', 'publisher'])
);
CREATE INDEX event_batches_job_keys ON event_batches USING gin (job_keys);
-- Analysed as the queue tables are (0013), and vacuumed after as many inserts: a vacuum empties
-- the GIN index's pending list, which each look by millisecond reads whole until then.
ALTER TABLE event_batches SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);

-- The events recorded so far, a thousand to a batch in the order received (those recorded before
-- migration 0014 have no order and come first, by their own times).
INSERT INTO event_batches (recorded_at, job_keys, event_ids, job_ids, outcomes, attempts,
                           consumer_groups, consumers, errors, ats, rounds, ignored, details)
SELECT max(recorded_at), array_agg(DISTINCT dispatcher_id_key(job_id)),
       array_agg(event_id ORDER BY n), array_agg(job_id ORDER BY n),
       array_agg(outcome ORDER BY n), array_agg(attempt ORDER BY n),
       array_agg(consumer_group ORDER BY n), array_agg(consumer ORDER BY n),
       array_agg(error ORDER BY n), array_agg(at ORDER BY n), array_agg(round ORDER BY n),
       array_agg(ignored ORDER BY n), array_agg(detail ORDER BY n)
FROM (
    SELECT e.*, row_number() OVER (ORDER BY received NULLS FIRST, at, event_id) AS n
    FROM job_events e
) AS received
GROUP BY (n - 1) / 1000
ORDER BY (n - 1) / 1000;

-- dispatcher_enqueue_v2 answers as v3 does (0024 says so): it is v3 from now on, so that one
-- function writes the notes of replaced and extended jobs.
CREATE OR REPLACE FUNCTION dispatcher_enqueue_v2(
    job_ids uuid[], job_shards integer[], id_hashes bigint[], routing_keys text[],
    payloads bytea[], job_headers jsonb[], priorities smallint[], ttls_ms bigint[],
    idempotency_keys text[], run_ats timestamptz[], namespaces text[], key_releases text[],
    on_existing text[], notify boolean, actor text
) RETURNS TABLE (ordinal integer, id uuid, created_at timestamptz, run_at timestamptz,
                 outcome text)
LANGUAGE sql AS $$
SELECT * FROM dispatcher_enqueue_v3(job_ids, job_shards, id_hashes, routing_keys, payloads,
                                    job_headers, priorities, ttls_ms, idempotency_keys, run_ats,
                                    namespaces, key_releases, on_existing, notify, actor)
$$;

-- dispatcher_enqueue_v3 as 0024 made it, but for the note of the jobs it replaced or extended:
-- one event batch for the statement's changes. Same arguments, same answers.
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

-- What job_events held that the jobs now keep, read before jobs is locked below: the last final
-- outcome reported for the round of a job still dispatching (as the confirm's settle read it),
-- and the ignored events kept.
CREATE TEMPORARY TABLE reported_0025 ON COMMIT DROP AS
SELECT DISTINCT ON (e.job_id) e.job_id, e.outcome, e.error
FROM job_events e JOIN jobs d ON d.id = e.job_id AND e.round = d.dispatch_round
WHERE d.state = 'dispatching' AND e.ignored IS NULL AND e.outcome IN ('succeeded', 'dead')
ORDER BY e.job_id, e.received DESC NULLS LAST, e.at DESC;
CREATE TEMPORARY TABLE ignored_0025 ON COMMIT DROP AS
SELECT job_id, count(*) AS events FROM job_events WHERE ignored IS NOT NULL GROUP BY job_id;

-- jobs.reported, jobs.reported_error: the final outcome (and its error) a consumer reported for
-- the job's round while it was still dispatching; the confirm's mark moves the job to it, and a
-- requeue clears it (a new round). jobs.ignored_kept: the job's ignored events kept in its
-- history (past a bound they are only counted, jobs.ignored_dropped). No default but a
-- constant, and a check NOT VALID (every row is NULL): nothing is rewritten or scanned. Last in
-- this migration, so that the lock they take on jobs (producers' inserts wait for it) is held
-- only to the end of it, not through the copy above.
ALTER TABLE jobs ADD COLUMN reported text;
ALTER TABLE jobs ADD COLUMN reported_error text;
ALTER TABLE jobs ADD COLUMN ignored_kept integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD CONSTRAINT jobs_reported_final CHECK (reported IN ('succeeded', 'dead'))
    NOT VALID;
UPDATE jobs j SET reported = r.outcome, reported_error = r.error
FROM reported_0025 r WHERE j.id = r.job_id;
UPDATE jobs j SET ignored_kept = k.events FROM ignored_0025 k WHERE j.id = k.job_id;

DROP TABLE job_events;
DROP SEQUENCE job_events_received;
