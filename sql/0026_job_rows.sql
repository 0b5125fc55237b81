-- 0026: the job row rebuilt for HOT updates (docs/development/job-storage.md, step 2). Nothing a
-- statement reads or writes changes; the rows are moved into a new table:
-- - fillfactor 50: an update finds room for the new version on the page of the old one (the jobs
--   of one insert are claimed, confirmed and settled together, so each page needs room for a
--   copy of every row on it);
-- - the columns that never change after the insert first, then the payload, then what a claim, a
--   confirm and a settle change, together at the end: an update whose new version stays on its
--   page logs only the bytes between the first and the last column it changed;
-- - rest: the state of a job waiting, dead, cancelled or expired (NULL otherwise), generated from
--   state, under jobs_rest: what a listing of those states will read once no index names state.
--
-- The rows are copied without a lock that stops producers (they insert meanwhile); then jobs is
-- locked against writes, the rows written since the copy's snapshot are copied again, and the new
-- table takes the old one's name, indexes, constraints and triggers. Producers wait for that last
-- part only. Nodes are stopped first (docs/how-to/upgrading.md): a row deleted meanwhile would come
-- back (a finished job, deleted again by the next housekeeping).

CREATE TABLE jobs_0026 (
    id               uuid        NOT NULL,
    shard            integer     NOT NULL,
    routing_key      text        NOT NULL,
    namespace        text,
    priority         smallint,
    ttl_ms           bigint,
    key_release      text,
    has_dependents   boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    run_at           timestamptz NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}',
    payload          bytea       NOT NULL,
    state            text        NOT NULL DEFAULT 'scheduled',
    updated_at       timestamptz NOT NULL DEFAULT now(),
    dispatched_at    timestamptz,
    last_error       text,
    lease_until      timestamptz,
    claim_epoch      bigint,
    claimed_by       text,
    publish_attempts integer     NOT NULL DEFAULT 0,
    dispatch_round   uuid                 DEFAULT gen_random_uuid(),
    reported         text,
    reported_error   text,
    waiting_for      integer     NOT NULL DEFAULT 0,
    ignored_kept     integer     NOT NULL DEFAULT 0,
    ignored_dropped  bigint      NOT NULL DEFAULT 0,
    idempotency_key  text,
    released_key     text,
    rest             text GENERATED ALWAYS AS (
        CASE WHEN state IN ('waiting', 'dead', 'cancelled', 'expired') THEN state END
    ) STORED,
    CONSTRAINT jobs_0026_state_known CHECK (state IN (
        'scheduled', 'dispatching', 'dispatched', 'cancelled', 'expired', 'succeeded', 'dead',
        'waiting'))
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);

-- The copy's snapshot, taken before it (the copy's own is later: it sees these rows and more).
CREATE TEMPORARY TABLE copied_0026 ON COMMIT DROP AS SELECT pg_current_snapshot() AS snapshot;

CREATE TEMPORARY VIEW moved_0026 AS
SELECT id, shard, routing_key, namespace, priority, ttl_ms, key_release, has_dependents,
       created_at, run_at, headers, payload, state, updated_at, dispatched_at, last_error,
       lease_until, claim_epoch, claimed_by, publish_attempts, dispatch_round, reported,
       reported_error, waiting_for, ignored_kept, ignored_dropped, idempotency_key, released_key,
       xmin AS written_by
FROM jobs;

INSERT INTO jobs_0026 (
    id, shard, routing_key, namespace, priority, ttl_ms, key_release, has_dependents, created_at,
    run_at, headers, payload, state, updated_at, dispatched_at, last_error, lease_until,
    claim_epoch, claimed_by, publish_attempts, dispatch_round, reported, reported_error,
    waiting_for, ignored_kept, ignored_dropped, idempotency_key, released_key)
SELECT id, shard, routing_key, namespace, priority, ttl_ms, key_release, has_dependents,
       created_at, run_at, headers, payload, state, updated_at, dispatched_at, last_error,
       lease_until, claim_epoch, claimed_by, publish_attempts, dispatch_round, reported,
       reported_error, waiting_for, ignored_kept, ignored_dropped, idempotency_key, released_key
FROM moved_0026
ORDER BY id;

ALTER TABLE jobs_0026 ADD CONSTRAINT jobs_0026_pkey PRIMARY KEY (id);
CREATE INDEX jobs_0026_due ON jobs_0026 (run_at, id) INCLUDE (shard, routing_key, namespace, priority)
    WHERE state = 'scheduled';
CREATE INDEX jobs_0026_finished ON jobs_0026 (updated_at)
    WHERE state IN ('dispatched', 'succeeded', 'dead', 'cancelled', 'expired');
CREATE UNIQUE INDEX jobs_0026_idempotency_key_namespace
    ON jobs_0026 (idempotency_key, (coalesce(namespace, ''))) WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_0026_key ON jobs_0026 (routing_key, id) INCLUDE (state, namespace);
CREATE INDEX jobs_0026_lease_until ON jobs_0026 (lease_until) INCLUDE (shard, run_at)
    WHERE lease_until IS NOT NULL;
CREATE INDEX jobs_0026_namespace ON jobs_0026 (namespace, id) WHERE namespace IS NOT NULL;
CREATE INDEX jobs_0026_released_key ON jobs_0026 (released_key, (coalesce(namespace, '')))
    WHERE released_key IS NOT NULL;
CREATE INDEX jobs_0026_state ON jobs_0026 (state, id) INCLUDE (namespace, routing_key);
CREATE INDEX jobs_0026_rest ON jobs_0026 (rest, id) WHERE rest IS NOT NULL;

-- From here producers wait (reads go on): the rows written since the copy's snapshot, inserted
-- or changed, are copied again. A row's xmin is the transaction that wrote it (32 bits, widened
-- with the epoch of now: the migration does not outlive an epoch).
LOCK TABLE jobs IN EXCLUSIVE MODE;

CREATE TEMPORARY TABLE rewritten_0026 ON COMMIT DROP AS
SELECT m.id FROM moved_0026 m, copied_0026 c
WHERE NOT pg_visible_in_snapshot(
    (((pg_current_xact_id()::text::bigint >> 32)
      - CASE WHEN m.written_by::text::bigint > (pg_current_xact_id()::text::bigint & 4294967295)
             THEN 1 ELSE 0 END) << 32
     | m.written_by::text::bigint)::text::xid8,
    c.snapshot);

DELETE FROM jobs_0026 n USING rewritten_0026 r WHERE n.id = r.id;
INSERT INTO jobs_0026 (
    id, shard, routing_key, namespace, priority, ttl_ms, key_release, has_dependents, created_at,
    run_at, headers, payload, state, updated_at, dispatched_at, last_error, lease_until,
    claim_epoch, claimed_by, publish_attempts, dispatch_round, reported, reported_error,
    waiting_for, ignored_kept, ignored_dropped, idempotency_key, released_key)
SELECT m.id, shard, routing_key, namespace, priority, ttl_ms, key_release, has_dependents,
       created_at, run_at, headers, payload, state, updated_at, dispatched_at, last_error,
       lease_until, claim_epoch, claimed_by, publish_attempts, dispatch_round, reported,
       reported_error, waiting_for, ignored_kept, ignored_dropped, idempotency_key, released_key
FROM moved_0026 m JOIN rewritten_0026 r ON r.id = m.id;

DROP VIEW moved_0026;
-- The dependencies' key to jobs goes with the old table, and comes back on the new one below.
DROP TABLE jobs CASCADE;

ALTER TABLE jobs_0026 RENAME TO jobs;
ALTER TABLE jobs RENAME CONSTRAINT jobs_0026_state_known TO jobs_state_known;
-- Not validated, as on the old table: rows from before 0019 and 0025 were never checked.
ALTER TABLE jobs ADD CONSTRAINT jobs_key_release_known CHECK (key_release IN ('dispatched', 'finished'))
    NOT VALID;
ALTER TABLE jobs ADD CONSTRAINT jobs_reported_final CHECK (reported IN ('succeeded', 'dead'))
    NOT VALID;
ALTER INDEX jobs_0026_pkey RENAME TO jobs_pkey;
ALTER INDEX jobs_0026_due RENAME TO jobs_due;
ALTER INDEX jobs_0026_finished RENAME TO jobs_finished;
ALTER INDEX jobs_0026_idempotency_key_namespace RENAME TO jobs_idempotency_key_namespace;
ALTER INDEX jobs_0026_key RENAME TO jobs_key;
ALTER INDEX jobs_0026_lease_until RENAME TO jobs_lease_until;
ALTER INDEX jobs_0026_namespace RENAME TO jobs_namespace;
ALTER INDEX jobs_0026_released_key RENAME TO jobs_released_key;
ALTER INDEX jobs_0026_state RENAME TO jobs_state;
ALTER INDEX jobs_0026_rest RENAME TO jobs_rest;

ALTER TABLE job_dependencies ADD CONSTRAINT job_dependencies_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE;

CREATE TRIGGER jobs_follow_prerequisite AFTER UPDATE OF state ON jobs FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IS DISTINCT FROM OLD.state
          AND NEW.state IN ('succeeded', 'dead', 'cancelled', 'expired'))
    EXECUTE FUNCTION jobs_follow_prerequisite();
CREATE TRIGGER jobs_release_key BEFORE UPDATE OF state ON jobs FOR EACH ROW
    WHEN (NEW.key_release IS NOT NULL AND NEW.idempotency_key IS NOT NULL
          AND NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION dispatcher_release_key();
