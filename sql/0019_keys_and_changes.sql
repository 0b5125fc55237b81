-- 0019: one pending job per key, keys free again once their job is done, and the dispatcher's
-- own changes to a job in its history.
--
-- jobs.key_release: when a job lets go of its idempotency key: NULL never (the key names the job
-- as long as its row lives), 'dispatched' once it was handed to RabbitMQ or ended otherwise,
-- 'finished' once it reached a final outcome (succeeded, dead, cancelled or expired). A job that
-- lets go keeps its key in released_key, and idempotency_key becomes NULL, so the unique index
-- (jobs_idempotency_key_namespace) no longer holds it and the next submit of the key creates a
-- new job. Both columns are NULL for every row stored before (nothing is rewritten).
ALTER TABLE jobs ADD COLUMN key_release text;
ALTER TABLE jobs ADD COLUMN released_key text;
ALTER TABLE jobs ADD CONSTRAINT jobs_key_release_known
    CHECK (key_release IN ('dispatched', 'finished')) NOT VALID;

CREATE FUNCTION dispatcher_release_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IN ('succeeded', 'dead', 'cancelled', 'expired')
       OR (NEW.state = 'dispatched' AND NEW.key_release = 'dispatched') THEN
        NEW.released_key := NEW.idempotency_key;
        NEW.idempotency_key := NULL;
    END IF;
    RETURN NEW;
END
$$;

-- Only a job that asked is looked at (the claims and marks of every other job never call it).
CREATE TRIGGER jobs_release_key BEFORE UPDATE OF state ON jobs
    FOR EACH ROW
    WHEN (NEW.key_release IS NOT NULL AND NEW.idempotency_key IS NOT NULL
          AND NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION dispatcher_release_key();

-- The jobs that let go of a key stay found by it (GET /v1/jobs?idempotency_key=). Built in the
-- migration's transaction: the new column is NULL everywhere, so this is one scan of the table
-- that inserts wait for (see README "Upgrading").
CREATE INDEX jobs_released_key ON jobs (released_key, (coalesce(namespace, '')))
    WHERE released_key IS NOT NULL;

-- job_events: the dispatcher's changes to a pending job (a submit that replaced or extended it, a
-- bulk action's cancel or reschedule) are steps of its history, each with what it did
-- (job_events.detail: the new time, or the bulk action that made the change).
ALTER TABLE job_events ADD COLUMN detail text;
ALTER TABLE job_events DROP CONSTRAINT job_events_outcome_known;
ALTER TABLE job_events ADD CONSTRAINT job_events_outcome_known
    CHECK (outcome IN ('started', 'succeeded', 'failed', 'dead', 'requeued', 'dispatched',
                       'replaced', 'extended', 'rescheduled', 'cancelled'))
    NOT VALID;
