-- 0005: recurring schedules. Each occurrence becomes an ordinary job whose idempotency key names
-- the schedule and the occurrence, so it is created once whichever node materialises it and
-- however often; next_at is advanced only after those jobs are stored. Every node's materialiser
-- locks the rows it works on (FOR UPDATE SKIP LOCKED), so nodes share the schedules without
-- coordination.
CREATE TABLE schedules (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace   text,                              -- NULL: the default namespace
    name        text        NOT NULL,
    cron        text,                              -- five fields, in timezone
    timezone    text        NOT NULL DEFAULT 'UTC',
    interval_s  bigint,                            -- or every interval_s from start_at
    routing_key text        NOT NULL,
    payload     bytea       NOT NULL,              -- the JSON body exactly as published
    headers     jsonb       NOT NULL DEFAULT '{}',
    priority    smallint,
    ttl_ms      bigint,
    start_at    timestamptz NOT NULL,
    end_at      timestamptz,
    missed      text        NOT NULL DEFAULT 'latest',
    grace_s     double precision NOT NULL DEFAULT 60,
    paused      boolean     NOT NULL DEFAULT false,
    next_at     timestamptz,                       -- the next occurrence not yet materialised;
                                                   -- NULL once the schedule has ended
    last_fired_at timestamptz,                     -- the latest occurrence materialised
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_timing CHECK ((cron IS NULL) <> (interval_s IS NULL)),
    CONSTRAINT schedules_missed_known CHECK (missed IN ('all', 'latest', 'skip'))
);

-- Names are unique per namespace (coalesce folds the default namespace into '', as for jobs).
CREATE UNIQUE INDEX schedules_name ON schedules ((coalesce(namespace, '')), name);

-- The materialiser's question: which active schedules fall due soon.
CREATE INDEX schedules_due ON schedules (next_at) WHERE NOT paused AND next_at IS NOT NULL;
