-- 0016: flow rules: what an operator holds back at dispatch, per routing key or routing-key
-- prefix (word by word), for one namespace or for every one (namespace NULL; '' is the default
-- namespace). dispatcher/flow/rules.py says which rule governs a job.
CREATE TABLE flow_rules (
    key          text        NOT NULL,
    namespace    text,
    paused       boolean     NOT NULL DEFAULT false,
    paused_until timestamptz,
    note         text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT flow_rules_one_per_key UNIQUE NULLS NOT DISTINCT (key, namespace),
    CONSTRAINT flow_rules_key_words CHECK (key <> '' AND right(key, 1) <> '.'),
    CONSTRAINT flow_rules_until_paused CHECK (paused_until IS NULL OR paused)
);

-- Every change of the rules bumps one counter, which the nodes poll (and are told of): a
-- node that missed a notification still sees the change within its poll.
CREATE TABLE flow_rules_epoch (
    one   boolean PRIMARY KEY DEFAULT true CHECK (one),
    epoch bigint  NOT NULL
);
INSERT INTO flow_rules_epoch VALUES (true, 0);

CREATE FUNCTION flow_rules_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE flow_rules_epoch SET epoch = epoch + 1;
    PERFORM pg_notify('dispatcher_flow_rules', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER flow_rules_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flow_rules
    FOR EACH STATEMENT EXECUTE FUNCTION flow_rules_changed();

-- Whether a job of routing key RK in namespace NS (NULL: the default) is held, given RULES, a
-- jsonb object {key: {namespace or "*": held}} of the rules that hold and of those that override
-- them below (rules.HeldKeys): the governing rule is the longest key matching RK word by word,
-- one naming NS before one for every namespace ("*"). Each of RK's prefixes, longest first, is
-- looked up once (a jsonb object's keys are sorted: a binary search, whatever the number of
-- rules). Loads, sweeps and claims pass over held jobs; they call this only for a job whose
-- first word some rule starts with (``queries.not_held``).
CREATE FUNCTION dispatcher_held(rk text, ns text, rules jsonb)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    candidate text := rk;
    by_namespace jsonb;
    held jsonb;
    last_dot integer;
BEGIN
    LOOP
        by_namespace := rules -> candidate;
        IF by_namespace IS NOT NULL THEN
            held := coalesce(by_namespace -> coalesce(ns, ''), by_namespace -> '*');
            IF held IS NOT NULL THEN
                RETURN held::boolean;
            END IF;
        END IF;
        last_dot := length(candidate) + 1 - strpos(reverse(candidate), '.');
        IF last_dot > length(candidate) THEN
            RETURN false;  -- no dot left: no shorter prefix
        END IF;
        candidate := left(candidate, last_dot - 1);
    END LOOP;
END
$$;

-- The due index carries the namespace and the priority too: the loads tell held jobs from the
-- index alone, and order what they load by priority (a job's priority orders it among jobs due
-- at the same instant and in a catch-up). Built in the migration's transaction: inserts wait
-- for it (seconds per million scheduled jobs; see README "Upgrading").
CREATE INDEX jobs_due_flow ON jobs (run_at, id) INCLUDE (shard, routing_key, namespace, priority)
    WHERE state = 'scheduled';
DROP INDEX jobs_due;
ALTER INDEX jobs_due_flow RENAME TO jobs_due;

-- A key of scope 'limits' manages the flow rules of its namespace.
ALTER TABLE api_keys DROP CONSTRAINT api_keys_scope_known;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scope_known
    CHECK (scope IN ('producer', 'monitor', 'admin', 'limits'));
