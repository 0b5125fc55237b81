-- 0020: bulk actions: cancel, requeue or reschedule every job a filter matches, worked in the
-- background by one node at a time, in bounded transactions along the jobs' ids
-- (dispatcher/bulk_runner.py).
--
-- The filter and the scope of the key that made the action are stored with it, so that a node
-- that takes the action over (its worker died) changes exactly what the caller could change.
-- status: running -> stopped (POST .../stop; -> running again on resume) | done | failed (reason).
-- cursor: every job of id <= cursor was handled (changed, or left alone as no longer matching);
-- each batch advances it in the transaction that changes the jobs, so a job is changed once.
CREATE TABLE bulk_actions (
    id uuid PRIMARY KEY,
    action text NOT NULL CONSTRAINT bulk_actions_action_known
        CHECK (action IN ('cancel', 'requeue', 'reschedule')),
    -- the filter: NULL matches anything
    namespace text,               -- NULL: every namespace (an admin's); '': the default one
    states text[] NOT NULL,       -- the states the action may change that the filter names
    routing_key text,             -- this routing key exactly
    routing_key_prefix text,      -- these words, or below them (billing: billing.charge)
    run_at_from timestamptz,
    run_at_to timestamptz,
    finished_from timestamptz,    -- updated_at of finished jobs
    finished_to timestamptz,
    error_contains text,          -- last_error contains this text
    -- the parameters of a reschedule: an absolute time, or a shift of each job's run_at
    run_at timestamptz,
    shift_s double precision,
    -- the scope of the key that made it: the words of its routing-key prefixes (NULL: any)
    scope_prefixes text[],
    created_by text NOT NULL,     -- the key's name
    status text NOT NULL DEFAULT 'running' CONSTRAINT bulk_actions_status_known
        CHECK (status IN ('running', 'stopped', 'done', 'failed')),
    reason text,                  -- why it failed
    cursor uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    touched bigint NOT NULL DEFAULT 0,
    matched_estimate bigint NOT NULL DEFAULT 0,  -- the filter's count when it was made
    worked_by text,               -- the node working it, while its lease runs
    lease_until timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);

-- What the workers look for: the running actions, oldest first.
CREATE INDEX bulk_actions_running ON bulk_actions (created_at) WHERE status = 'running';
