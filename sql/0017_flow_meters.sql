-- 0017: what flow rules that meter a key's jobs, rather than hold them all, will take from: a
-- rate (at most rate_per_s jobs a second, cluster-wide, in bursts of at most burst) and a number
-- in flight (at most max_in_flight jobs let go and not finished: a consumer's succeeded or dead,
-- the job's ttl run out after dispatch, or in_flight_timeout_s after it was let go, whichever
-- comes first). The rule columns, the buckets, the slots and the function that takes them.
ALTER TABLE flow_rules
    ADD COLUMN rate_per_s double precision,
    ADD COLUMN burst integer,
    ADD COLUMN max_in_flight integer,
    ADD COLUMN in_flight_timeout_s double precision,
    ADD CONSTRAINT flow_rules_rate CHECK (
        (rate_per_s IS NULL AND burst IS NULL) OR (rate_per_s > 0 AND burst >= 1)),
    ADD CONSTRAINT flow_rules_in_flight CHECK (
        (max_in_flight IS NULL AND in_flight_timeout_s IS NULL)
        OR (max_in_flight >= 1 AND in_flight_timeout_s > 0));

-- A metered rule's tokens (its rate) and slots (its jobs in flight), apart from the rules
-- themselves: taking them changes no rule, so it bumps no change counter and notifies nobody.
CREATE TABLE flow_buckets (
    key         text             NOT NULL,
    namespace   text,
    tokens      double precision NOT NULL,
    refilled_at timestamptz      NOT NULL,
    CONSTRAINT flow_buckets_one_per_rule UNIQUE NULLS NOT DISTINCT (key, namespace)
);

CREATE TABLE flow_slots (
    job_id     uuid        PRIMARY KEY,
    key        text        NOT NULL,
    namespace  text,
    expires_at timestamptz NOT NULL
);
CREATE INDEX flow_slots_rule ON flow_slots (key, namespace);

-- Let go at most as many of WANTED (job ids, oldest first) as the rule's tokens and free slots
-- allow, and take them: returns the ids let go, a prefix of WANTED. The rule's bucket row is
-- locked first (one taker at a time per rule, across the cluster); the slots are counted after
-- the lock, in a statement of their own, so that they include what the taker before committed.
-- A bucket starts full. A slot is free again once its job is no longer dispatching or
-- dispatched (a consumer said succeeded or dead, it expired, or it was cancelled), its ttl ran
-- out after dispatch, or its timeout passed.
CREATE FUNCTION dispatcher_flow_take(
    rule_key text, rule_namespace text, rate double precision, burst integer,
    max_in_flight integer, timeout_s double precision, wanted uuid[]
) RETURNS uuid[] LANGUAGE plpgsql AS $$
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
