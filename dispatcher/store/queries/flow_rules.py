"""Flow rules (``store/flow_rules.py``)."""

from typing import Final

_FLOW_RULE_COLUMNS: Final = (
    "key, namespace, paused, paused_until, note, rate_per_s, burst, max_in_flight,"
    " in_flight_timeout_s, updated_at, owner"
)

# Every rule, with the epoch read in the same snapshot (the nodes poll the epoch).
FLOW_RULES: Final = f"""
SELECT (SELECT epoch FROM flow_rules_epoch) AS epoch, {_FLOW_RULE_COLUMNS}
FROM (VALUES (1)) AS one(n) LEFT JOIN flow_rules ON true
ORDER BY key, namespace NULLS FIRST
"""

FLOW_RULES_EPOCH: Final = "SELECT epoch FROM flow_rules_epoch"

# The rules a caller may see: $1 the namespace ('' default; NULL: every rule).
LIST_FLOW_RULES: Final = f"""
SELECT {_FLOW_RULE_COLUMNS} FROM flow_rules
WHERE $1::text IS NULL OR namespace = $1
ORDER BY key, namespace NULLS FIRST
"""

GET_FLOW_RULE: Final = f"""
SELECT {_FLOW_RULE_COLUMNS} FROM flow_rules WHERE key = $1 AND namespace IS NOT DISTINCT FROM $2
"""

# Rule changes are few: one lock orders them, so the caps on their number hold, and a rule's
# owner read before a change is still its owner when the change is made.
LOCK_FLOW_RULES: Final = "LOCK TABLE flow_rules IN SHARE ROW EXCLUSIVE MODE"

# The rules one owner holds: $1 'operator' (every operator's rule, whatever its namespace), or
# 'tenant' and $2 the namespace.
COUNT_FLOW_RULES: Final = """
SELECT count(*) FROM flow_rules WHERE owner = $1 AND ($1 = 'operator' OR namespace = $2)
"""

# $1 key, $2 namespace, $3 paused, $4 paused_until, $5 note, $6 rate_per_s, $7 burst,
# $8 max_in_flight, $9 in_flight_timeout_s, $10 owner.
PUT_FLOW_RULE: Final = f"""
INSERT INTO flow_rules (key, namespace, paused, paused_until, note, rate_per_s, burst,
                        max_in_flight, in_flight_timeout_s, owner)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (key, namespace) DO UPDATE
SET paused = excluded.paused, paused_until = excluded.paused_until, note = excluded.note,
    rate_per_s = excluded.rate_per_s, burst = excluded.burst,
    max_in_flight = excluded.max_in_flight, in_flight_timeout_s = excluded.in_flight_timeout_s,
    owner = excluded.owner, updated_at = now()
RETURNING {_FLOW_RULE_COLUMNS}
"""

# A rule deleted takes its bucket and its slots along (a rule made again starts afresh). $3: the
# caller's owner: a tenant deletes only a tenant's rule (none deleted: not found, or not its own).
DELETE_FLOW_RULE: Final = f"""
WITH gone AS (
    DELETE FROM flow_rules
    WHERE key = $1 AND namespace IS NOT DISTINCT FROM $2 AND ($3 = 'operator' OR owner = $3)
    RETURNING {_FLOW_RULE_COLUMNS}
), bucket AS (
    DELETE FROM flow_buckets WHERE key = $1 AND namespace IS NOT DISTINCT FROM $2
      AND EXISTS (SELECT 1 FROM gone)
), slots AS (
    DELETE FROM flow_slots WHERE key = $1 AND namespace IS NOT DISTINCT FROM $2
      AND EXISTS (SELECT 1 FROM gone)
)
SELECT * FROM gone
"""

# Let go at most as many of the job ids $7 (oldest first) as the rule ($1 key, $2 namespace)
# allows now: $3 a rate a second and $4 its burst, $5 a number in flight and $6 the seconds
# after which a silent job's slot is free (NULLs: no such limit). The ids let go, a prefix of
# $7 (sql/0017).
FLOW_TAKE: Final = "SELECT dispatcher_flow_take($1, $2, $3, $4, $5, $6, $7::uuid[])"

# The meter's look at its busy rules: for each (``m``: its key, its namespace, NULL for every one,
# its tag, how many it wants, and the run_at before which it need not look), the due scheduled
# jobs of the shards $1 it governs, oldest first. A job is the rule's when
# ``dispatcher_flow_meter_tag`` (sql/0023) finds the rule's tag for it in $7
# (``RuleBook.governing_tags``): a longer key's rule of the same owner, or one naming the job's
# namespace, governs its own; either owner's pause holds it. Each rule's look walks the due index
# from its floor (``flow.meter`` keeps it at its oldest due job) up to now; the key test comes
# before the function (a comparison), which sees the rule's jobs alone.
# $2 keys, $3 namespaces, $4 tags, $5 how many, $6 floors (same order).
METERED_DUE: Final = """
SELECT m.tag, j.id, j.shard, j.run_at, j.routing_key, j.priority
FROM unnest($2::text[], $3::text[], $4::int[], $5::int[], $6::timestamptz[])
     AS m(key, namespace, tag, wanted, floor)
CROSS JOIN LATERAL (
    SELECT id, shard, run_at, routing_key, priority FROM jobs
    WHERE state = 'scheduled' AND run_at >= m.floor AND run_at <= now()
      AND shard = ANY($1::int[])
      AND (routing_key = m.key OR starts_with(routing_key, m.key || '.'))
      AND (m.namespace IS NULL OR coalesce(namespace, '') = m.namespace)
      AND dispatcher_flow_meter_tag(routing_key, namespace, $7::jsonb) = m.tag
    ORDER BY run_at, id
    LIMIT m.wanted
) AS j
ORDER BY m.tag, j.run_at, j.id
"""

# The meter's look at its quiet rules, all in one walk of the due index from $2 to now: the tags
# ($4, ``RuleBook.governing_tags``) of the rules that govern a due scheduled job of the shards $1
# (a job whose routing key starts with none of the rules' first words, $3, is passed over by a
# comparison), and the time of the look (one row at least, the time alone when none did).
METERED_WAKING: Final = """
SELECT now() AS looked_at, found.tag
FROM (VALUES (1)) AS one(n)
LEFT JOIN LATERAL (
    SELECT DISTINCT dispatcher_flow_meter_tag(routing_key, namespace, $4::jsonb) AS tag
    FROM jobs
    WHERE state = 'scheduled' AND run_at >= $2 AND run_at <= now()
      AND shard = ANY($1::int[]) AND split_part(routing_key, '.', 1) = ANY($3::text[])
) AS found ON true
"""
