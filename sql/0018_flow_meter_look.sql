-- 0018: what the meter of a flow rule looks up to find the jobs it governs (queries.METERED_DUE):
-- the value RULES (a jsonb object {key: {namespace or "*": value}}, rules.RuleBook.governing_tags)
-- gives the rule that governs a job of routing key RK in namespace NS (NULL: the default), found
-- as dispatcher_held (0016) finds it: the longest key matching RK word by word, one naming NS
-- before one for every namespace. NULL when no rule of RULES governs it.
CREATE FUNCTION dispatcher_flow_governing(rk text, ns text, rules jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    candidate text := rk;
    by_namespace jsonb;
    found jsonb;
    last_dot integer;
BEGIN
    LOOP
        by_namespace := rules -> candidate;
        IF by_namespace IS NOT NULL THEN
            found := coalesce(by_namespace -> coalesce(ns, ''), by_namespace -> '*');
            IF found IS NOT NULL THEN
                RETURN found;
            END IF;
        END IF;
        last_dot := length(candidate) + 1 - strpos(reverse(candidate), '.');
        IF last_dot > length(candidate) THEN
            RETURN NULL;
        END IF;
        candidate := left(candidate, last_dot - 1);
    END LOOP;
END
$$;

-- One walk of a key's prefixes for both questions: whether a job is held is what its governing
-- rule says (0016's own walk, replaced; a SQL function, inlined where it is called).
CREATE OR REPLACE FUNCTION dispatcher_held(rk text, ns text, rules jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce((dispatcher_flow_governing(rk, ns, rules))::boolean, false)
$$;
