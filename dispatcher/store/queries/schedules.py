"""Recurring schedules."""

from typing import Final

# Serialise the creations of one namespace's schedules for the rest of the transaction, so that
# the count below and the insert after it cannot race another creation past the limit.
# $1 namespace ('' for the default one).
LOCK_NAMESPACE_SCHEDULES: Final = """
SELECT pg_advisory_xact_lock(hashtext('dispatcher.recurring'), hashtext($1))
"""

# $1 namespace ('' for the default one).
COUNT_NAMESPACE_SCHEDULES: Final = """
SELECT count(*) FROM schedules WHERE coalesce(namespace, '') = $1
"""

# The timing of a namespace's schedules that still make jobs (not paused, not ended), for its
# quota. $1 namespace ('' for the default one), $2 a schedule id to leave out (the one changing).
ACTIVE_NAMESPACE_TIMINGS: Final = """
SELECT cron, timezone, interval_s, start_at, end_at FROM schedules
WHERE coalesce(namespace, '') = $1 AND NOT paused AND next_at IS NOT NULL AND id <> $2
"""

# A new schedule; nothing when the name is taken in the namespace (the caller answers 409).
# $1 namespace (NULL: default), $2 name, $3 cron, $4 timezone, $5 interval_s, $6 routing key,
# $7 payload, $8 headers (JSON text), $9 priority, $10 ttl_ms, $11 start_at, $12 end_at,
# $13 missed, $14 grace_s, $15 paused, $16 next_at.
INSERT_SCHEDULE: Final = """
INSERT INTO schedules (namespace, name, cron, timezone, interval_s, routing_key, payload, headers,
                       priority, ttl_ms, start_at, end_at, missed, grace_s, paused, next_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT ((coalesce(namespace, '')), name) DO NOTHING
RETURNING *
"""

# One schedule by name in one namespace ('' for the default one). $1 namespace, $2 name, $3
# routing-key filter.
SELECT_SCHEDULE: Final = """
SELECT * FROM schedules WHERE coalesce(namespace, '') = $1 AND name = $2
  AND ($3::text[] IS NULL OR EXISTS (
      SELECT FROM unnest($3::text[]) AS w
      WHERE routing_key = w OR starts_with(routing_key, w || '.')))
"""

# The same, locked for a change. $1 namespace ('' for the default one), $2 name, $3 routing-key
# filter.
LOCK_SCHEDULE: Final = """
SELECT * FROM schedules WHERE coalesce(namespace, '') = $1 AND name = $2
  AND ($3::text[] IS NULL OR EXISTS (
      SELECT FROM unnest($3::text[]) AS w
      WHERE routing_key = w OR starts_with(routing_key, w || '.')))
FOR UPDATE
"""

# A page of schedules in creation order. $1 namespace filter (NULL: every namespace), $2 after
# id, $3 limit, $4 routing-key filter, $5 the payload bytes a page may hold (as for LIST_JOBS).
LIST_SCHEDULES: Final = """
SELECT * FROM (
  SELECT *, count(*) OVER () AS found,
         sum(octet_length(payload)) OVER (ORDER BY id) - octet_length(payload) AS bytes_before
  FROM (
    SELECT * FROM schedules
    WHERE ($1::text IS NULL OR coalesce(namespace, '') = $1) AND id > $2
      AND ($4::text[] IS NULL OR EXISTS (
          SELECT FROM unnest($4::text[]) AS w
          WHERE routing_key = w OR starts_with(routing_key, w || '.')))
    ORDER BY id
    LIMIT $3
  ) AS candidates
) AS page
WHERE bytes_before < $5
ORDER BY id
"""

# Everything a PATCH may change, by id (the row is locked by LOCK_SCHEDULE); a resume clears the
# error the materialiser parked it with. $1 id, $2 cron,
# $3 timezone, $4 interval_s, $5 routing key, $6 payload, $7 headers (JSON text), $8 priority,
# $9 ttl_ms, $10 end_at, $11 missed, $12 grace_s, $13 paused, $14 next_at.
UPDATE_SCHEDULE: Final = """
UPDATE schedules
SET cron = $2, timezone = $3, interval_s = $4, routing_key = $5, payload = $6, headers = $7::jsonb,
    priority = $8, ttl_ms = $9, end_at = $10, missed = $11, grace_s = $12, paused = $13,
    next_at = $14, updated_at = now(), error = CASE WHEN $13 THEN error END
WHERE id = $1
RETURNING *
"""

# $1 namespace ('' for the default one), $2 name, $3 routing-key filter. Jobs already made from it
# stay.
DELETE_SCHEDULE: Final = """
DELETE FROM schedules WHERE coalesce(namespace, '') = $1 AND name = $2
  AND ($3::text[] IS NULL OR EXISTS (
      SELECT FROM unnest($3::text[]) AS w
      WHERE routing_key = w OR starts_with(routing_key, w || '.')))
RETURNING *
"""

# The materialiser's live lane: active schedules whose next occurrence falls between "behind" and
# the horizon, earliest first, locked until the pass commits; rows another node is working on are
# skipped, not waited for. $1 behind before, $2 horizon, $3 limit.
CLAIM_LIVE_SCHEDULES: Final = """
SELECT * FROM schedules
WHERE NOT paused AND next_at IS NOT NULL AND next_at >= $1 AND next_at <= $2
ORDER BY next_at
LIMIT $3
FOR UPDATE SKIP LOCKED
"""

# Its catch-up lane: active schedules behind, least recently served first (every pass sets
# updated_at), so that each gets its turn whatever its backlog. $1 behind before, $2 limit.
CLAIM_BEHIND_SCHEDULES: Final = """
SELECT * FROM schedules
WHERE NOT paused AND next_at IS NOT NULL AND next_at < $1
ORDER BY updated_at, id
LIMIT $2
FOR UPDATE SKIP LOCKED
"""

# After a pass stored its jobs: where each schedule goes on (NULL: it has ended) and the latest
# occurrence materialised (NULL: unchanged). $1 ids, $2 next_at, $3 last_fired_at: parallel arrays.
ADVANCE_SCHEDULES: Final = """
UPDATE schedules s
SET next_at = a.next_at, last_fired_at = coalesce(a.last_fired_at, s.last_fired_at),
    updated_at = now()
FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[]) AS a(id, next_at, last_fired_at)
WHERE s.id = a.id
"""

# Pause schedules the materialiser cannot plan, with the reason; a resume (UPDATE_SCHEDULE)
# clears it. $1 ids, $2 reasons: parallel arrays.
PARK_SCHEDULES: Final = """
UPDATE schedules s SET paused = true, error = p.reason, updated_at = now()
FROM unnest($1::bigint[], $2::text[]) AS p(id, reason)
WHERE s.id = p.id
"""
