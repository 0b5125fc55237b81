-- 0023: who owns each flow rule: the operator (an admin key set it last) or the tenant of its
-- namespace (that namespace's limits key). A tenant's key may not change an operator's rule, and
-- each owner's rules are weighed apart, so that a tenant's rule can hold more but never release
-- what an operator's holds (dispatcher/flow/rules.py). No rule said who made it before: every
-- existing rule is an operator's (an admin key may hand one back by deleting it).
ALTER TABLE flow_rules
    ADD COLUMN owner text NOT NULL DEFAULT 'operator',
    ADD CONSTRAINT flow_rules_owner_known CHECK (owner IN ('operator', 'tenant')),
    ADD CONSTRAINT flow_rules_tenant_namespace CHECK (owner = 'operator' OR namespace IS NOT NULL);

-- Each namespace's tenant has its own cap, and the operators theirs: counted under the table lock.
CREATE INDEX flow_rules_owner ON flow_rules (owner, namespace);

-- Whether a job of routing key RK in namespace NS (NULL: the default) is held, given RULES, a
-- jsonb object {owner: {key: {namespace or "*": held}}} (rules.HeldKeys): held when the rule
-- governing it among the operator's holds it, or the one among the tenant's does, each found
-- as dispatcher_flow_governing (0018) finds it. dispatcher_held (0016) stays for nodes older
-- than this migration, which pass the rules without owners.
CREATE FUNCTION dispatcher_flow_held(rk text, ns text, rules jsonb)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce((dispatcher_flow_governing(rk, ns, rules -> 'operator'))::boolean, false)
        OR coalesce((dispatcher_flow_governing(rk, ns, rules -> 'tenant'))::boolean, false)
$$;

-- The tag of the metered rule whose meter lets a job of RK in NS go, given TAGS, a jsonb object
-- {owner: {key: {namespace or "*": tag}}} (rules.RuleBook.governing_tags: a metered rule's
-- index, -1 a rule that holds, -2 one that restrains nothing), picked as RuleBook.governing
-- picks the rule: NULL when either owner's governing rule holds the job; else the operator's
-- meter, else the tenant's; NULL when neither meters it.
CREATE FUNCTION dispatcher_flow_meter_tag(rk text, ns text, tags jsonb)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN g.operator = -1 OR g.tenant = -1 THEN NULL
        WHEN g.operator >= 0 THEN g.operator
        WHEN g.tenant >= 0 THEN g.tenant
    END
    FROM (SELECT (dispatcher_flow_governing(rk, ns, tags -> 'operator'))::integer AS operator,
                 (dispatcher_flow_governing(rk, ns, tags -> 'tenant'))::integer AS tenant) AS g
$$;
