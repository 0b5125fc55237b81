-- 0010: recurring schedules and dependencies cannot flood (or stop) the dispatcher.
--
-- schedules.error: why the materialiser paused a schedule it could not plan or whose jobs could
-- not be stored (a zone gone from the tz database, a value stored before the API bounded it).
-- Such a schedule was retried every pass, or failed the pass and stopped the node; now it is
-- parked: paused with its reason, which the API shows and a resume clears.
ALTER TABLE schedules ADD COLUMN error text;

-- Dependents are followed within a budget per transaction. 0006's trigger released or cancelled
-- every dependent of a finishing prerequisite in the transaction of that change: with 100 000
-- dependents one consumer event became a transaction of seconds holding 100 000 row locks, and
-- every event recorded after it waited. Now the trigger follows them itself only while its
-- transaction has followed at most 1000 (so the common case stays atomic and immediate, as
-- before); otherwise it queues the prerequisite in dependency_followups, in the same transaction
-- (a crash loses nothing), and every dispatcher works the queue in batches of its own
-- (dispatcher/dependents.py). Both follow with one function, dispatcher_follow_dependents.
-- A cancel's own dependents are followed by the trigger that cancel fires: nested, no deeper than
-- 16 triggers (a long chain would exhaust the stack), queued beyond.
CREATE TABLE dependency_followups (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    prerequisite_id uuid        NOT NULL,
    state           text        NOT NULL,  -- what it became: succeeded releases, others cancel
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- The dependents are followed in job id order; the last one followed so far.
    cursor          uuid        NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'
);
-- A prerequisite's follow-ups are worked in order, one at a time (a requeued dead job that then
-- succeeds must not release what its death cancels).
CREATE INDEX dependency_followups_prerequisite ON dependency_followups (prerequisite_id, id);

-- The batches walk a prerequisite's dependents in id order (0006's index on prerequisite_id alone
-- would rescan the ones already followed at every batch). Building it locks job_dependencies
-- against writes for a few seconds per million rows.
CREATE INDEX IF NOT EXISTS job_dependencies_prerequisite_job
    ON job_dependencies (prerequisite_id, job_id);
DROP INDEX IF EXISTS job_dependencies_prerequisite;

-- Follow the next dependents (at most batch_size, in id order after after_job) of a prerequisite
-- that reached a final state (reached) at reached_at; parameters are named apart from columns.
-- Succeeded: each edge is satisfied once (a repeated event finds it satisfied already) and each
-- waiting dependent counted down under its row lock (two prerequisites succeeding at once
-- release it exactly once), released at zero with its run_at kept and a due notice for the node
-- owning its shard. Otherwise: each dependent still waiting and submitted by then (not one
-- waiting for it again after a requeue) is cancelled, naming it.
CREATE FUNCTION dispatcher_follow_dependents(
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
       (SELECT count(pg_notify('dispatcher_due',
                               released.id::text || ',' || released.shard || ','
                               || extract(epoch FROM released.run_at) || ','
                               || released.routing_key))
        FROM released WHERE released.state = 'scheduled'),
       (SELECT count(*) FROM cancelled)
$$;

CREATE OR REPLACE FUNCTION jobs_follow_prerequisite() RETURNS trigger LANGUAGE plpgsql AS $$
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
