-- 0004: what happened to a job after it was published, as its consumers reported it, and the
-- final states those reports lead to. Events are recorded once per event id (they arrive
-- at-least-once) and are deleted with their job by the retention task; no foreign key, so
-- deleting and recording never lock each other's rows through it.
CREATE TABLE job_events (
    event_id       uuid        PRIMARY KEY,
    job_id         uuid        NOT NULL,
    outcome        text        NOT NULL,
    attempt        integer     NOT NULL,
    consumer_group text        NOT NULL,
    consumer       text        NOT NULL,
    error          text,
    at             timestamptz NOT NULL,          -- when the consumer saw it
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_events_outcome_known
        -- the consumers' four, and the dispatcher's requeued (with the dispatch it replaces)
        CHECK (outcome IN ('started', 'succeeded', 'failed', 'dead', 'requeued', 'dispatched'))
);
CREATE INDEX job_events_job ON job_events (job_id, at);

-- The error of a dead job, kept on the row so that listing dead jobs needs no join.
ALTER TABLE jobs ADD COLUMN last_error text;

ALTER TABLE jobs DROP CONSTRAINT jobs_state_known;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_known
    CHECK (state IN ('scheduled', 'dispatching', 'dispatched', 'cancelled', 'expired',
                     'succeeded', 'dead')) NOT VALID;
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_state_known;

-- Finished jobs by age, for the retention task's small batches.
CREATE INDEX jobs_finished ON jobs (updated_at)
    WHERE state IN ('dispatched', 'succeeded', 'dead', 'cancelled', 'expired');
