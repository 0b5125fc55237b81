-- 0001: jobs, the source of truth. A row exists before its POST is answered; the scheduler only
-- ever moves it forward through the states named in the check constraint (see dispatcher/models.py).
CREATE TABLE jobs (
    id               uuid        PRIMARY KEY,            -- UUIDv7: inserts append to the index
    shard            integer     NOT NULL,
    state            text        NOT NULL DEFAULT 'scheduled',
    routing_key      text        NOT NULL,
    payload          bytea       NOT NULL,               -- the JSON body exactly as published
    headers          jsonb       NOT NULL DEFAULT '{}',
    priority         smallint,
    ttl_ms           bigint,
    idempotency_key  text,
    run_at           timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    dispatched_at    timestamptz,
    lease_until      timestamptz,                        -- set while dispatching
    claim_epoch      bigint,                             -- the shard epoch the claim was made under
    claimed_by       text,
    publish_attempts integer     NOT NULL DEFAULT 0,
    CONSTRAINT jobs_state_known
        CHECK (state IN ('scheduled', 'dispatching', 'dispatched', 'cancelled', 'expired'))
);

-- A second submission with the same key finds the first instead of creating a job.
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The loader walks scheduled jobs in due order; INCLUDE(shard) lets it do so from the index alone.
CREATE INDEX jobs_due ON jobs (run_at, id) INCLUDE (shard) WHERE state = 'scheduled';

-- Claims whose publish was never confirmed are found by their lease.
CREATE INDEX jobs_leased ON jobs (lease_until) INCLUDE (shard, run_at)
    WHERE state = 'dispatching';

CREATE INDEX jobs_routing_key ON jobs (routing_key, id);
