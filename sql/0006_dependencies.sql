-- 0006: job dependencies. A job submitted with `after` waits (state 'waiting') until each job it
-- names has succeeded, then is scheduled; if one of them dies, is cancelled or expires, it is
-- cancelled with that reason, and so are the jobs waiting for it in turn.
--
-- The follow-up runs in a trigger, so it commits in the same transaction as the state change
-- that causes it whichever statement makes it (a consumer's event, DELETE, a ttl running out):
-- a crash can never leave a prerequisite finished and its dependents unreleased. The trigger's
-- WHEN clause only calls the function for a job that has dependents, so the hot paths (claims,
-- confirms, the events of jobs nobody waits for) pay nothing for it.

CREATE TABLE job_dependencies (
    job_id          uuid     NOT NULL REFERENCES jobs (id) ON DELETE CASCADE, -- the waiting job
    prerequisite_id uuid     NOT NULL,  -- no foreign key: retention may delete it first
    position        smallint NOT NULL,  -- its index in the job's `after`
    satisfied       boolean  NOT NULL DEFAULT false, -- the prerequisite has succeeded
    PRIMARY KEY (job_id, prerequisite_id),
    CONSTRAINT job_dependencies_not_self CHECK (job_id <> prerequisite_id)
);
-- A finishing prerequisite finds its dependents.
CREATE INDEX job_dependencies_prerequisite ON job_dependencies (prerequisite_id);

-- Prerequisites not yet succeeded (the release is a decrement, not a count); and whether any job
-- waits for this one (set under the row lock a dependent's submission takes). Constant defaults:
-- no table rewrite.
ALTER TABLE jobs ADD COLUMN waiting_for integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;

ALTER TABLE jobs DROP CONSTRAINT jobs_state_known;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_known
    CHECK (state IN ('scheduled', 'dispatching', 'dispatched', 'cancelled', 'expired',
                     'succeeded', 'dead', 'waiting')) NOT VALID;
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_state_known;

CREATE FUNCTION jobs_follow_prerequisite() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    notified bigint;
BEGIN
    IF NEW.state = 'succeeded' THEN
        -- Each edge is satisfied once (a repeated event finds it satisfied already), and the
        -- decrement re-reads the dependent's row under its lock, so two prerequisites succeeding
        -- at once release it exactly once. Released jobs keep their run_at; the notification
        -- lets the owning node put one already inside its loaded window into memory.
        WITH satisfied AS (
            UPDATE job_dependencies SET satisfied = true
            WHERE prerequisite_id = NEW.id AND NOT satisfied
            RETURNING job_id
        ), released AS (
            UPDATE jobs j
            SET waiting_for = j.waiting_for - 1,
                state = CASE WHEN j.waiting_for = 1 THEN 'scheduled' ELSE j.state END,
                updated_at = now()
            FROM satisfied
            WHERE j.id = satisfied.job_id AND j.state = 'waiting'
            RETURNING j.id, j.shard, j.run_at, j.state, j.routing_key
        )
        SELECT count(pg_notify('dispatcher_due',
                               released.id::text || ',' || released.shard || ','
                               || extract(epoch FROM released.run_at) || ','
                               || released.routing_key))
        INTO notified
        FROM released WHERE released.state = 'scheduled';
    ELSE
        -- Dead, cancelled or expired: every job still waiting for it, directly or through other
        -- waiting jobs, can never run. Each is cancelled naming the prerequisite it waited for
        -- (done in one statement: the triggers it fires find nothing left waiting).
        WITH RECURSIVE doomed (id, cause, cause_state) AS (
            SELECT d.job_id, NEW.id, NEW.state
            FROM job_dependencies d JOIN jobs j ON j.id = d.job_id
            WHERE d.prerequisite_id = NEW.id AND j.state = 'waiting'
            UNION
            SELECT d.job_id, doomed.id, 'cancelled'::text
            FROM doomed
            JOIN job_dependencies d ON d.prerequisite_id = doomed.id
            JOIN jobs j ON j.id = d.job_id
            WHERE j.state = 'waiting'
        ), first_cause AS (
            SELECT DISTINCT ON (id) id, cause, cause_state FROM doomed ORDER BY id, cause
        )
        UPDATE jobs j
        SET state = 'cancelled',
            last_error = 'prerequisite ' || first_cause.cause || ' ' || first_cause.cause_state,
            updated_at = now()
        FROM first_cause
        WHERE j.id = first_cause.id AND j.state = 'waiting';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_follow_prerequisite
    AFTER UPDATE OF state ON jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IS DISTINCT FROM OLD.state
          AND NEW.state IN ('succeeded', 'dead', 'cancelled', 'expired'))
    EXECUTE FUNCTION jobs_follow_prerequisite();
