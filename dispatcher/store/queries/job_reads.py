"""Reading one job or a page of them, and moving one at an operator's word (cancel, reschedule,
requeue)."""

from typing import Final

from dispatcher.store.queries.shared import in_flight_under, note_events

# $1 id, $2 namespace filter, $3 routing-key filter.
SELECT_JOB: Final = """
SELECT * FROM jobs WHERE id = $1 AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
  AND ($3::text[] IS NULL OR EXISTS (
      SELECT FROM unnest($3::text[]) AS w
      WHERE routing_key = w OR starts_with(routing_key, w || '.')))
"""

# The filters of a page's every branch: $5 namespace, $6 the words a key's prefixes name, $8 a
# routing-key prefix (see LIST_JOBS).
_PAGE_FILTERS: Final = """($5::text IS NULL OR coalesce(namespace, '') = $5)
         AND ($6::text[] IS NULL OR EXISTS (
             SELECT FROM unnest($6::text[]) AS w
             WHERE routing_key = w OR starts_with(routing_key, w || '.')))
         AND ($8::text IS NULL OR routing_key = $8 OR starts_with(routing_key, $8 || '.'))"""

# A page of jobs: in id (= creation) order, but scheduled jobs in due order (run_at, id), the
# order of the one index that holds them. $1 state or NULL, $2 routing key or NULL, $3 after id
# (for scheduled jobs: after that job's place in due order), $4 limit, $5 namespace filter, $6
# routing-key filter (the words a key's prefixes name; NULL: any), $7 the payload bytes a page may
# hold (it ends before the job that would start past them; ``found`` says how many the filters
# found, so a page cut short is told from the last one), $8 routing-key prefix (words, as a
# key's: billing is billing and billing.*; NULL: any), tested as $6 is, with starts_with: no LIKE
# metacharacter, and correct in any collation, where a range on jobs_key would hold only in byte
# order (C). It rides the branch of the other filters; alone it walks the primary key.
# One branch per filter, each reading its index (sql/0009, sql/0027): a branch whose test on the
# parameters alone fails is skipped at run time, so a generic plan of the prepared statement
# (which the plan cache may choose after five runs) still reads only the index the filter needs;
# one WHERE of "$1 IS NULL OR state = $1" tests would get a generic plan walking the primary key.
# Each branch finds ids only (index-only scans where it can): planned as whole rows, a state's
# page walked the primary key past every older row, because the planner cannot know that the rows
# of a state (scheduled, say) are the newest. No index names the state of a job dispatched or
# succeeded (an update of it stays HOT): their pages walk the primary key, the bulk of the table.
LIST_JOBS: Final = f"""
SELECT * FROM (
  SELECT *, count(*) OVER () AS found,  -- the page's jobs, and the payload bytes before each
         sum(octet_length(payload)) OVER (
             ORDER BY CASE WHEN $1 = 'scheduled' THEN run_at END, id
         ) - octet_length(payload) AS bytes_before
  FROM jobs
  WHERE id = ANY (ARRAY(
      (SELECT id FROM jobs  -- a routing key, and a state but scheduled: jobs_key
       WHERE routing_key = $2 AND ($1::text IS NULL OR (state = $1 AND $1 <> 'scheduled'))
         AND id > $3 AND {_PAGE_FILTERS}
       ORDER BY id LIMIT $4)
      UNION ALL
      (SELECT id FROM jobs  -- scheduled, and a routing key if given: jobs_due, in due order
       WHERE $1 = 'scheduled' AND state = 'scheduled' AND ($2::text IS NULL OR routing_key = $2)
         AND (run_at, id) > (coalesce((SELECT c.run_at FROM jobs c WHERE c.id = $3),
                                      '-infinity'), $3)
         AND {_PAGE_FILTERS}
       ORDER BY run_at, id LIMIT $4)
      UNION ALL
      (SELECT id FROM jobs  -- waiting, dead, cancelled or expired: jobs_rest
       WHERE $2::text IS NULL AND $1 IN ('waiting', 'dead', 'cancelled', 'expired')
         AND rest = $1 AND id > $3 AND {_PAGE_FILTERS}
       ORDER BY id LIMIT $4)
      UNION ALL
      (SELECT j.id FROM claims c  -- dispatching: the claims' rows, each job by the primary key
       CROSS JOIN LATERAL unnest(c.ids) AS claimed(id)
       JOIN jobs j ON j.id = claimed.id
       WHERE $2::text IS NULL AND $1 = 'dispatching' AND {in_flight_under("j", "c")}
         AND j.id > $3 AND {_PAGE_FILTERS}
       ORDER BY j.id LIMIT $4)
      UNION ALL
      (SELECT id FROM jobs  -- dispatched or succeeded: the primary key
       WHERE $2::text IS NULL AND $1 IN ('dispatched', 'succeeded') AND state = $1 AND id > $3
         AND {_PAGE_FILTERS}
       ORDER BY id LIMIT $4)
      UNION ALL
      (SELECT id FROM jobs  -- a named namespace: jobs_namespace
       WHERE $2::text IS NULL AND $1::text IS NULL AND namespace = nullif($5, '') AND id > $3
         AND {_PAGE_FILTERS}
       ORDER BY id LIMIT $4)
      UNION ALL
      (SELECT id FROM jobs  -- every job, or the default namespace's: the primary key
       WHERE $2::text IS NULL AND $1::text IS NULL AND ($5::text IS NULL OR $5 = '')
         AND ($5::text IS NULL OR namespace IS NULL) AND id > $3 AND {_PAGE_FILTERS}
       ORDER BY id LIMIT $4)
  ))
) AS page
WHERE bytes_before < $7  -- a page ends past $7 bytes of payloads, after one job at least
ORDER BY CASE WHEN $1 = 'scheduled' THEN run_at END, id
"""

# The fence a change of one pending job takes first, in a statement of its own (sql/0029): its
# shard's row of shard_epochs, FOR NO KEY UPDATE, so that a claim of the shard under way commits
# first and the change, reading the job in a new snapshot, sees it claimed; and no claim starts on
# the shard until the change commits. The job's shard (none: no such job); the change tests the
# job is still on it ($4 of CANCEL_JOB, $8 of RESCHEDULE_JOB). $1 id.
FENCE_JOB: Final = """
WITH fence AS (
    SELECT se.shard FROM shard_epochs se
    WHERE se.shard = (SELECT shard FROM jobs WHERE id = $1)
    FOR NO KEY UPDATE
)
SELECT j.shard FROM jobs j WHERE j.id = $1 AND (SELECT count(*) FROM fence) >= 0
"""

# Only a job still waiting can be cancelled; a claimed one may be in RabbitMQ already. A job
# waiting for its prerequisites too (the 0006 trigger cancels the jobs waiting for it in turn).
# $1 id, $2 namespace filter, $3 routing-key filter, $4 the shard fenced (FENCE_JOB).
CANCEL_JOB: Final = """
UPDATE jobs SET state = 'cancelled', lease_until = NULL, updated_at = now()
WHERE id = $1 AND state IN ('scheduled', 'waiting') AND shard = $4
  AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
  AND ($3::text[] IS NULL OR EXISTS (
      SELECT FROM unnest($3::text[]) AS w
      WHERE routing_key = w OR starts_with(routing_key, w || '.')))
RETURNING *
"""

# Move a job still waiting to fire (or for its prerequisites) to a new time (and/or give it a new
# payload or priority), and tell every node (a due notice, see ``store/due_notices.py``): the
# owner of its shard may hold it in memory at the old time, where the claim's run_at test makes
# that entry fire nothing, and must learn the new one.
# $1 id, $2 namespace filter, $3 routing-key filter, $4 run_at or NULL (keep), $5 payload or
# NULL (keep), $6 whether to set the priority, $7 the priority, $8 the shard fenced (FENCE_JOB).
RESCHEDULE_JOB: Final = """
UPDATE jobs
SET run_at = coalesce($4, run_at), payload = coalesce($5, payload),
    priority = CASE WHEN $6 THEN $7::smallint ELSE priority END, updated_at = now()
WHERE id = $1 AND state IN ('scheduled', 'waiting') AND shard = $8
  AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
  AND ($3::text[] IS NULL OR EXISTS (
      SELECT FROM unnest($3::text[]) AS w
      WHERE routing_key = w OR starts_with(routing_key, w || '.')))
RETURNING *, dispatcher_notify_due_v1(id, shard, run_at, routing_key)
"""

# A requeue's note in the job's history: the dispatch it replaces, and the requeue. $5 node id.
_NOTE_REQUEUED: Final = note_events(
    """(SELECT id, 'dispatched'::text AS outcome, dispatched_at AS at FROM old
    WHERE dispatched_at IS NOT NULL
    UNION ALL
    SELECT id, 'requeued', now() FROM old) AS steps""",
    job_id="id",
    outcome="outcome",
    consumer="$5::text",
    at="at",
)

# Put a dead job back on the schedule, due now, on a shard this node owns (so it fires from here),
# as a new dispatch round (events of the earlier ones are ignored from now on). Its history keeps
# the dispatch being replaced (the row holds only the latest) and notes the requeue.
# $1 id, $2 namespace filter, $3 routing-key filter, $4 shard, $5 node id.
REQUEUE_DEAD_JOB: Final = f"""
WITH old AS (
    SELECT id, dispatched_at FROM jobs
    WHERE id = $1 AND state = 'dead' AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
      AND ($3::text[] IS NULL OR EXISTS (
          SELECT FROM unnest($3::text[]) AS w
          WHERE routing_key = w OR starts_with(routing_key, w || '.')))
    FOR UPDATE
), requeued AS (
    UPDATE jobs j SET state = 'scheduled', run_at = now(), shard = $4, last_error = NULL,
                      dispatched_at = NULL, lease_until = NULL, claimed_by = NULL,
                      dispatch_round = gen_random_uuid(), updated_at = now()
    FROM old WHERE j.id = old.id
    RETURNING j.*
), noted AS (
    {_NOTE_REQUEUED}
)
SELECT * FROM requeued
"""
