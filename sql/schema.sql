-- The schema the migrations in this folder build, applied in order to an empty database: for
-- reading, never run by the service. Written by `make schema` (pg_dump --schema-only);
-- tests/integration/test_schema_file.py fails when it differs from the migrations.

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

CREATE FUNCTION public.dispatcher_claim_v1(wanted_ids uuid[], held_shards integer[], held_epochs bigint[], node text, lease_s double precision, entry_run_ats double precision[], fence_s double precision, held_rules jsonb, held_words text[], granted uuid[]) RETURNS TABLE(fenced_at_s double precision, answered_at_s double precision, id uuid, shard integer, routing_key text, payload bytea, run_at timestamp with time zone, idempotency_key text, headers jsonb, priority smallint, ttl_ms bigint, dispatch_round uuid, namespace text)
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.dispatcher_enqueue_v1(job_ids uuid[], job_shards integer[], id_hashes bigint[], routing_keys text[], payloads bytea[], job_headers jsonb[], priorities smallint[], ttls_ms bigint[], idempotency_keys text[], run_ats timestamp with time zone[], namespaces text[], notify boolean) RETURNS TABLE(id uuid, created_at timestamp with time zone, run_at timestamp with time zone)
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.dispatcher_enqueue_v2(job_ids uuid[], job_shards integer[], id_hashes bigint[], routing_keys text[], payloads bytea[], job_headers jsonb[], priorities smallint[], ttls_ms bigint[], idempotency_keys text[], run_ats timestamp with time zone[], namespaces text[], key_releases text[], on_existing text[], notify boolean, actor text) RETURNS TABLE(ordinal integer, id uuid, created_at timestamp with time zone, run_at timestamp with time zone, outcome text)
    LANGUAGE sql
    AS $$
SELECT * FROM dispatcher_enqueue_v3(job_ids, job_shards, id_hashes, routing_keys, payloads,
                                    job_headers, priorities, ttls_ms, idempotency_keys, run_ats,
                                    namespaces, key_releases, on_existing, notify, actor)
$$;

CREATE FUNCTION public.dispatcher_enqueue_v3(job_ids uuid[], job_shards integer[], id_hashes bigint[], routing_keys text[], payloads bytea[], job_headers jsonb[], priorities smallint[], ttls_ms bigint[], idempotency_keys text[], run_ats timestamp with time zone[], namespaces text[], key_releases text[], on_existing text[], notify boolean, actor text) RETURNS TABLE(ordinal integer, id uuid, created_at timestamp with time zone, run_at timestamp with time zone, outcome text)
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.dispatcher_flow_governing(rk text, ns text, rules jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    candidate text := rk;
    by_namespace jsonb;
    found jsonb;
    last_dot integer;
BEGIN
    LOOP
        by_namespace := rules -> candidate;
        IF by_namespace IS NOT NULL THEN
            found := coalesce(by_namespace -> coalesce(ns, ''), by_namespace -> '*');
            IF found IS NOT NULL THEN
                RETURN found;
            END IF;
        END IF;
        last_dot := length(candidate) + 1 - strpos(reverse(candidate), '.');
        IF last_dot > length(candidate) THEN
            RETURN NULL;
        END IF;
        candidate := left(candidate, last_dot - 1);
    END LOOP;
END
$$;

CREATE FUNCTION public.dispatcher_flow_held(rk text, ns text, rules jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT coalesce((dispatcher_flow_governing(rk, ns, rules -> 'operator'))::boolean, false)
        OR coalesce((dispatcher_flow_governing(rk, ns, rules -> 'tenant'))::boolean, false)
$$;

CREATE FUNCTION public.dispatcher_flow_meter_tag(rk text, ns text, tags jsonb) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE
        WHEN g.operator = -1 OR g.tenant = -1 THEN NULL
        WHEN g.operator >= 0 THEN g.operator
        WHEN g.tenant >= 0 THEN g.tenant
    END
    FROM (SELECT (dispatcher_flow_governing(rk, ns, tags -> 'operator'))::integer AS operator,
                 (dispatcher_flow_governing(rk, ns, tags -> 'tenant'))::integer AS tenant) AS g
$$;

CREATE FUNCTION public.dispatcher_flow_take(rule_key text, rule_namespace text, rate double precision, burst integer, max_in_flight integer, timeout_s double precision, wanted uuid[]) RETURNS uuid[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    bucket flow_buckets%ROWTYPE;
    taken_at timestamptz;
    available double precision := 0;
    free bigint := 0;
    used bigint;
    granted integer;
BEGIN
    INSERT INTO flow_buckets AS b (key, namespace, tokens, refilled_at)
    VALUES (rule_key, rule_namespace, coalesce(burst, 0), clock_timestamp())
    ON CONFLICT (key, namespace) DO UPDATE SET key = b.key
    RETURNING * INTO bucket;
    taken_at := clock_timestamp();
    IF rate IS NOT NULL THEN
        available := least(burst::double precision, bucket.tokens
            + rate * greatest(0, extract(epoch FROM taken_at - bucket.refilled_at)));
    END IF;
    IF max_in_flight IS NOT NULL THEN
        -- The slots of jobs other than WANTED: one of WANTED let go before keeps its own.
        SELECT count(*) INTO used FROM flow_slots s
        WHERE s.key = rule_key AND s.namespace IS NOT DISTINCT FROM rule_namespace
          AND s.job_id <> ALL(wanted);
        IF used + cardinality(wanted) > max_in_flight THEN
            DELETE FROM flow_slots s
            WHERE s.key = rule_key AND s.namespace IS NOT DISTINCT FROM rule_namespace
              AND (s.expires_at <= taken_at OR NOT EXISTS (
                    SELECT 1 FROM jobs j
                    WHERE j.id = s.job_id
                      AND CASE j.state
                            WHEN 'scheduled' THEN true  -- let go, not claimed yet
                            WHEN 'dispatching' THEN true
                            WHEN 'dispatched' THEN j.ttl_ms IS NULL OR j.dispatched_at IS NULL
                                OR j.dispatched_at + j.ttl_ms * interval '1 millisecond' > taken_at
                            ELSE false
                          END));
            SELECT count(*) INTO used FROM flow_slots s
            WHERE s.key = rule_key AND s.namespace IS NOT DISTINCT FROM rule_namespace
              AND s.job_id <> ALL(wanted);
        END IF;
        free := greatest(0, max_in_flight - used);
    END IF;
    granted := cardinality(wanted);
    IF rate IS NOT NULL THEN
        granted := least(granted, greatest(0, floor(available))::integer);
    END IF;
    IF max_in_flight IS NOT NULL THEN
        granted := least(granted, free)::integer;
    END IF;
    IF rate IS NOT NULL THEN
        UPDATE flow_buckets SET tokens = available - granted, refilled_at = taken_at
        WHERE key = rule_key AND namespace IS NOT DISTINCT FROM rule_namespace;
    END IF;
    IF max_in_flight IS NOT NULL AND granted > 0 THEN
        INSERT INTO flow_slots (job_id, key, namespace, expires_at)
        SELECT id, rule_key, rule_namespace, taken_at + make_interval(secs => timeout_s)
        FROM unnest(wanted[1:granted]) AS w(id)
        ON CONFLICT (job_id) DO UPDATE
        SET key = excluded.key, namespace = excluded.namespace, expires_at = excluded.expires_at;
    END IF;
    RETURN wanted[1:granted];
END
$$;

CREATE FUNCTION public.dispatcher_follow_dependents(prerequisite uuid, reached text, reached_at timestamp with time zone, after_job uuid, batch_size integer) RETURNS TABLE(followed bigint, last_job_id uuid, released bigint, cancelled bigint)
    LANGUAGE sql
    AS $$
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

CREATE FUNCTION public.dispatcher_held(rk text, ns text, rules jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT coalesce((dispatcher_flow_governing(rk, ns, rules))::boolean, false)
$$;

CREATE FUNCTION public.dispatcher_id_key(id uuid) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN ((('x'::text || encode(SUBSTRING(uuid_send(id) FROM 1 FOR 7), 'hex'::text)))::bit(56))::bigint;

CREATE FUNCTION public.dispatcher_notify_due_v1(job_id uuid, job_shard integer, job_run_at timestamp with time zone, job_routing_key text) RETURNS void
    LANGUAGE sql
    AS $$
SELECT pg_notify('dispatcher_due',
                 job_id::text || ',' || job_shard || ',' || extract(epoch FROM job_run_at)
                 || coalesce(',' || job_routing_key, ''))
$$;

CREATE FUNCTION public.dispatcher_release_key() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.state IN ('succeeded', 'dead', 'cancelled', 'expired')
       OR (NEW.state = 'dispatched' AND NEW.key_release = 'dispatched') THEN
        NEW.released_key := NEW.idempotency_key;
        NEW.idempotency_key := NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION public.flow_rules_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE flow_rules_epoch SET epoch = epoch + 1;
    PERFORM pg_notify('dispatcher_flow_rules', '');
    RETURN NULL;
END
$$;

CREATE FUNCTION public.jobs_follow_prerequisite() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    budget constant integer := 1000;  -- dependents followed inline per transaction
    max_depth constant integer := 16;  -- nested triggers: a cancel's cascade, inline
    -- What this transaction has followed inline so far: a transaction-local setting, gone at
    -- commit or rollback (pooled connections keep no state).
    used integer := coalesce(
        nullif(current_setting('dispatcher.dependents_followed', true), ''), '0')::integer;
    edges integer;
BEGIN
    SELECT count(*) INTO edges FROM (
        SELECT 1 FROM job_dependencies WHERE prerequisite_id = NEW.id LIMIT budget - used + 1
    ) AS counted;
    IF edges = 0 THEN
        RETURN NULL;
    END IF;
    -- Queued when it would pass the budget or the depth, or when a follow-up of this
    -- prerequisite is queued already (they are worked in order).
    IF edges > budget - used OR pg_trigger_depth() > max_depth
       OR EXISTS (SELECT 1 FROM dependency_followups WHERE prerequisite_id = NEW.id) THEN
        INSERT INTO dependency_followups (prerequisite_id, state) VALUES (NEW.id, NEW.state);
        RETURN NULL;
    END IF;
    PERFORM set_config('dispatcher.dependents_followed', (used + edges)::text, true);
    PERFORM dispatcher_follow_dependents(
        NEW.id, NEW.state, now(), '00000000-0000-0000-0000-000000000000', budget);
    RETURN NULL;
END
$$;

SET default_tablespace = '';

SET default_table_access_method = heap;

CREATE TABLE public.api_keys (
    id bigint NOT NULL,
    token_sha256 bytea NOT NULL,
    name text DEFAULT ''::text NOT NULL,
    scope text NOT NULL,
    namespace text,
    routing_key_prefixes text[] DEFAULT '{}'::text[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at timestamp with time zone,
    CONSTRAINT api_keys_scope_known CHECK ((scope = ANY (ARRAY['producer'::text, 'monitor'::text, 'admin'::text, 'limits'::text])))
);

ALTER TABLE public.api_keys ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.api_keys_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.bulk_actions (
    id uuid NOT NULL,
    action text NOT NULL,
    namespace text,
    states text[] NOT NULL,
    routing_key text,
    routing_key_prefix text,
    run_at_from timestamp with time zone,
    run_at_to timestamp with time zone,
    finished_from timestamp with time zone,
    finished_to timestamp with time zone,
    error_contains text,
    run_at timestamp with time zone,
    shift_s double precision,
    scope_prefixes text[],
    created_by text NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    reason text,
    cursor uuid DEFAULT '00000000-0000-0000-0000-000000000000'::uuid NOT NULL,
    touched bigint DEFAULT 0 NOT NULL,
    matched_estimate bigint DEFAULT 0 NOT NULL,
    worked_by text,
    lease_until timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    by_operator boolean DEFAULT false NOT NULL,
    turn_at timestamp with time zone,
    CONSTRAINT bulk_actions_action_known CHECK ((action = ANY (ARRAY['cancel'::text, 'requeue'::text, 'reschedule'::text]))),
    CONSTRAINT bulk_actions_status_known CHECK ((status = ANY (ARRAY['running'::text, 'stopped'::text, 'done'::text, 'failed'::text])))
);

CREATE TABLE public.claims (
    id bigint NOT NULL,
    made_at timestamp with time zone DEFAULT now() NOT NULL,
    node text,
    lease_until timestamp with time zone NOT NULL,
    ids uuid[] NOT NULL,
    shards integer[] NOT NULL,
    epochs bigint[] NOT NULL
);

ALTER TABLE public.claims ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.claims_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.dependency_followups (
    id bigint NOT NULL,
    prerequisite_id uuid NOT NULL,
    state text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    cursor uuid DEFAULT '00000000-0000-0000-0000-000000000000'::uuid NOT NULL
);

ALTER TABLE public.dependency_followups ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.dependency_followups_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.event_batches (
    id bigint NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    job_keys bigint[] NOT NULL,
    event_ids uuid[] NOT NULL,
    job_ids uuid[] NOT NULL,
    outcomes text[] NOT NULL,
    attempts integer[] NOT NULL,
    consumer_groups text[] NOT NULL,
    consumers text[] NOT NULL,
    errors text[] NOT NULL,
    ats timestamp with time zone[] NOT NULL,
    rounds uuid[] NOT NULL,
    ignored text[] NOT NULL,
    details text[] NOT NULL,
    CONSTRAINT event_batches_aligned CHECK (((cardinality(event_ids) > 0) AND (cardinality(job_ids) = cardinality(event_ids)) AND (cardinality(outcomes) = cardinality(event_ids)) AND (cardinality(attempts) = cardinality(event_ids)) AND (cardinality(consumer_groups) = cardinality(event_ids)) AND (cardinality(consumers) = cardinality(event_ids)) AND (cardinality(errors) = cardinality(event_ids)) AND (cardinality(ats) = cardinality(event_ids)) AND (cardinality(rounds) = cardinality(event_ids)) AND (cardinality(ignored) = cardinality(event_ids)) AND (cardinality(details) = cardinality(event_ids)))),
    CONSTRAINT event_batches_ignored_known CHECK ((array_remove(ignored, NULL::text) <@ ARRAY['other_round'::text, 'no_round'::text, 'routing_key'::text, 'no_user'::text, 'publisher'::text])),
    CONSTRAINT event_batches_outcomes_known CHECK ((outcomes <@ ARRAY['started'::text, 'succeeded'::text, 'failed'::text, 'dead'::text, 'requeued'::text, 'dispatched'::text, 'replaced'::text, 'extended'::text, 'rescheduled'::text, 'cancelled'::text]))
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.02', autovacuum_vacuum_insert_threshold='1000', autovacuum_analyze_scale_factor='0.02', autovacuum_analyze_threshold='1000');

ALTER TABLE public.event_batches ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.event_batches_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.flow_buckets (
    key text NOT NULL,
    namespace text,
    tokens double precision NOT NULL,
    refilled_at timestamp with time zone NOT NULL
);

CREATE TABLE public.flow_rules (
    key text NOT NULL,
    namespace text,
    paused boolean DEFAULT false NOT NULL,
    paused_until timestamp with time zone,
    note text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    rate_per_s double precision,
    burst integer,
    max_in_flight integer,
    in_flight_timeout_s double precision,
    owner text DEFAULT 'operator'::text NOT NULL,
    CONSTRAINT flow_rules_in_flight CHECK ((((max_in_flight IS NULL) AND (in_flight_timeout_s IS NULL)) OR ((max_in_flight >= 1) AND (in_flight_timeout_s > (0)::double precision)))),
    CONSTRAINT flow_rules_key_words CHECK (((key <> ''::text) AND ("right"(key, 1) <> '.'::text))),
    CONSTRAINT flow_rules_owner_known CHECK ((owner = ANY (ARRAY['operator'::text, 'tenant'::text]))),
    CONSTRAINT flow_rules_rate CHECK ((((rate_per_s IS NULL) AND (burst IS NULL)) OR ((rate_per_s > (0)::double precision) AND (burst >= 1)))),
    CONSTRAINT flow_rules_tenant_namespace CHECK (((owner = 'operator'::text) OR (namespace IS NOT NULL))),
    CONSTRAINT flow_rules_until_paused CHECK (((paused_until IS NULL) OR paused))
);

CREATE TABLE public.flow_rules_epoch (
    one boolean DEFAULT true NOT NULL,
    epoch bigint NOT NULL,
    CONSTRAINT flow_rules_epoch_one_check CHECK (one)
);

CREATE TABLE public.flow_slots (
    job_id uuid NOT NULL,
    key text NOT NULL,
    namespace text,
    expires_at timestamp with time zone NOT NULL
);

CREATE TABLE public.job_counts (
    state text NOT NULL,
    routing_keys text[] NOT NULL,
    jobs bigint[] NOT NULL,
    other_jobs bigint NOT NULL,
    counted_at timestamp with time zone NOT NULL,
    count_s double precision NOT NULL
);

CREATE TABLE public.job_dependencies (
    job_id uuid NOT NULL,
    prerequisite_id uuid NOT NULL,
    "position" smallint NOT NULL,
    satisfied boolean DEFAULT false NOT NULL,
    CONSTRAINT job_dependencies_not_self CHECK ((job_id <> prerequisite_id))
);

CREATE TABLE public.jobs (
    id uuid NOT NULL,
    shard integer NOT NULL,
    routing_key text NOT NULL,
    namespace text,
    priority smallint,
    ttl_ms bigint,
    key_release text,
    has_dependents boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    run_at timestamp with time zone NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    payload bytea NOT NULL,
    state text DEFAULT 'scheduled'::text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatched_at timestamp with time zone,
    last_error text,
    lease_until timestamp with time zone,
    claim_epoch bigint,
    claimed_by text,
    publish_attempts integer DEFAULT 0 NOT NULL,
    dispatch_round uuid DEFAULT gen_random_uuid(),
    reported text,
    reported_error text,
    waiting_for integer DEFAULT 0 NOT NULL,
    ignored_kept integer DEFAULT 0 NOT NULL,
    ignored_dropped bigint DEFAULT 0 NOT NULL,
    idempotency_key text,
    released_key text,
    rest text GENERATED ALWAYS AS (
CASE
    WHEN (state = ANY (ARRAY['waiting'::text, 'dead'::text, 'cancelled'::text, 'expired'::text])) THEN state
    ELSE NULL::text
END) STORED,
    CONSTRAINT jobs_state_known CHECK ((state = ANY (ARRAY['scheduled'::text, 'dispatching'::text, 'dispatched'::text, 'cancelled'::text, 'expired'::text, 'succeeded'::text, 'dead'::text, 'waiting'::text])))
)
WITH (fillfactor='50', autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.02', autovacuum_analyze_threshold='1000');

CREATE TABLE public.schedules (
    id bigint NOT NULL,
    namespace text,
    name text NOT NULL,
    cron text,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    interval_s bigint,
    routing_key text NOT NULL,
    payload bytea NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    priority smallint,
    ttl_ms bigint,
    start_at timestamp with time zone NOT NULL,
    end_at timestamp with time zone,
    missed text DEFAULT 'latest'::text NOT NULL,
    grace_s double precision DEFAULT 60 NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    next_at timestamp with time zone,
    last_fired_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    error text,
    CONSTRAINT schedules_missed_known CHECK ((missed = ANY (ARRAY['all'::text, 'latest'::text, 'skip'::text]))),
    CONSTRAINT schedules_timing CHECK (((cron IS NULL) <> (interval_s IS NULL)))
);

ALTER TABLE public.schedules ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.schedules_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.schema_migrations (
    version text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    checksum text
);

CREATE TABLE public.shard_epochs (
    shard integer NOT NULL,
    epoch bigint DEFAULT 0 NOT NULL,
    owner text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_token_sha256_key UNIQUE (token_sha256);

ALTER TABLE ONLY public.bulk_actions
    ADD CONSTRAINT bulk_actions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.claims
    ADD CONSTRAINT claims_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.dependency_followups
    ADD CONSTRAINT dependency_followups_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.event_batches
    ADD CONSTRAINT event_batches_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.flow_buckets
    ADD CONSTRAINT flow_buckets_one_per_rule UNIQUE NULLS NOT DISTINCT (key, namespace);

ALTER TABLE ONLY public.flow_rules_epoch
    ADD CONSTRAINT flow_rules_epoch_pkey PRIMARY KEY (one);

ALTER TABLE ONLY public.flow_rules
    ADD CONSTRAINT flow_rules_one_per_key UNIQUE NULLS NOT DISTINCT (key, namespace);

ALTER TABLE ONLY public.flow_slots
    ADD CONSTRAINT flow_slots_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY public.job_counts
    ADD CONSTRAINT job_counts_pkey PRIMARY KEY (state);

ALTER TABLE ONLY public.job_dependencies
    ADD CONSTRAINT job_dependencies_pkey PRIMARY KEY (job_id, prerequisite_id);

ALTER TABLE public.jobs
    ADD CONSTRAINT jobs_key_release_known CHECK ((key_release = ANY (ARRAY['dispatched'::text, 'finished'::text]))) NOT VALID;

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE public.jobs
    ADD CONSTRAINT jobs_reported_final CHECK ((reported = ANY (ARRAY['succeeded'::text, 'dead'::text]))) NOT VALID;

ALTER TABLE ONLY public.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.shard_epochs
    ADD CONSTRAINT shard_epochs_pkey PRIMARY KEY (shard);

CREATE INDEX bulk_actions_budget ON public.bulk_actions USING btree (COALESCE(namespace, '*'::text), by_operator);

CREATE INDEX bulk_actions_ended ON public.bulk_actions USING btree (updated_at) WHERE (status <> 'running'::text);

CREATE INDEX bulk_actions_running ON public.bulk_actions USING btree (created_at) WHERE (status = 'running'::text);

CREATE INDEX claims_lease_until ON public.claims USING btree (lease_until);

CREATE INDEX dependency_followups_prerequisite ON public.dependency_followups USING btree (prerequisite_id, id);

CREATE INDEX event_batches_job_keys ON public.event_batches USING gin (job_keys);

CREATE INDEX flow_rules_owner ON public.flow_rules USING btree (owner, namespace);

CREATE INDEX flow_slots_rule ON public.flow_slots USING btree (key, namespace);

CREATE INDEX job_dependencies_prerequisite_job ON public.job_dependencies USING btree (prerequisite_id, job_id);

CREATE INDEX jobs_due ON public.jobs USING btree (run_at, id) INCLUDE (shard, routing_key, namespace, priority) WHERE (state = 'scheduled'::text);

CREATE UNIQUE INDEX jobs_idempotency_key_namespace ON public.jobs USING btree (idempotency_key, COALESCE(namespace, ''::text)) WHERE (idempotency_key IS NOT NULL);

CREATE INDEX jobs_key ON public.jobs USING btree (routing_key, id) INCLUDE (state, namespace);

CREATE INDEX jobs_namespace ON public.jobs USING btree (namespace, id) WHERE (namespace IS NOT NULL);

CREATE INDEX jobs_released_key ON public.jobs USING btree (released_key, COALESCE(namespace, ''::text)) WHERE (released_key IS NOT NULL);

CREATE INDEX jobs_rest ON public.jobs USING btree (rest, id) WHERE (rest IS NOT NULL);

CREATE INDEX schedules_due ON public.schedules USING btree (next_at) WHERE ((NOT paused) AND (next_at IS NOT NULL));

CREATE UNIQUE INDEX schedules_name ON public.schedules USING btree (COALESCE(namespace, ''::text), name);

CREATE TRIGGER flow_rules_changed AFTER INSERT OR DELETE OR UPDATE OR TRUNCATE ON public.flow_rules FOR EACH STATEMENT EXECUTE FUNCTION public.flow_rules_changed();

CREATE TRIGGER jobs_follow_prerequisite AFTER UPDATE OF state ON public.jobs FOR EACH ROW WHEN ((new.has_dependents AND (new.state IS DISTINCT FROM old.state) AND (new.state = ANY (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text, 'expired'::text])))) EXECUTE FUNCTION public.jobs_follow_prerequisite();

CREATE TRIGGER jobs_release_key BEFORE UPDATE OF state ON public.jobs FOR EACH ROW WHEN (((new.key_release IS NOT NULL) AND (new.idempotency_key IS NOT NULL) AND (new.state IS DISTINCT FROM old.state))) EXECUTE FUNCTION public.dispatcher_release_key();

ALTER TABLE ONLY public.job_dependencies
    ADD CONSTRAINT job_dependencies_job_id_fkey FOREIGN KEY (job_id) REFERENCES public.jobs(id) ON DELETE CASCADE;
