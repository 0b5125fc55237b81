"""Bulk actions (``dispatcher/bulk/model.py``, ``dispatcher/bulk/runner.py``)."""

from typing import Final

from dispatcher.store.queries.shared import note_events


# Whether a job matches a bulk action's filter, its states aside: nine parameters from ``first``
# on, each NULL to match anything: namespace filter ('' the default one), routing key, routing-key
# prefix (words), run_at from, run_at to, finished (updated_at) from, to, text the last error
# contains (any case), the words of the key's routing-key prefixes. ``alias`` prefixes the job's
# columns. Built once, here, with parameter numbers only (no value is ever formatted in).
def bulk_match(alias: str, first: int) -> str:
    (
        namespace,
        routing_key,
        prefix,
        run_from,
        run_to,
        finished_from,
        finished_to,
        error,
        scope,
    ) = (f"${first + offset}" for offset in range(9))
    return f"""({namespace}::text IS NULL OR coalesce({alias}namespace, '') = {namespace})
  AND ({routing_key}::text IS NULL OR {alias}routing_key = {routing_key})
  AND ({prefix}::text IS NULL OR {alias}routing_key = {prefix}
       OR starts_with({alias}routing_key, {prefix} || '.'))
  AND ({run_from}::timestamptz IS NULL OR {alias}run_at >= {run_from})
  AND ({run_to}::timestamptz IS NULL OR {alias}run_at <= {run_to})
  AND ({finished_from}::timestamptz IS NULL OR {alias}updated_at >= {finished_from})
  AND ({finished_to}::timestamptz IS NULL OR {alias}updated_at <= {finished_to})
  AND ({error}::text IS NULL OR strpos(lower({alias}last_error), lower({error})) > 0)
  AND ({scope}::text[] IS NULL OR EXISTS (
      SELECT FROM unnest({scope}::text[]) AS w
      WHERE {alias}routing_key = w OR starts_with({alias}routing_key, w || '.')))"""


# The next ids a bulk action's batch looks at: the first $2 jobs after the cursor $1, in id order,
# in one of the states $3, $4 (NULL: one state only) matching the filter ($5-$13, ``bulk_match``;
# $6 is its routing key). One branch per index, as in LIST_JOBS (a branch whose test on the
# parameters alone fails is skipped at run time, in a generic plan too): a routing key walks
# jobs_key (routing_key, id) from the cursor; otherwise waiting and dead jobs their range of
# jobs_rest (rest, id) each (an IN of both states would read and sort every row of both after the
# cursor), and scheduled jobs all of jobs_due, the one index of them (in due order: each batch
# sorts the ids after the cursor; OFFSET 0 keeps the planner from walking the primary key for the
# order instead, through the finished jobs, the bulk of the table, which it cannot know are
# older). A batch of scheduled jobs costs an index-only read of every scheduled job the filter
# matches, never a read of the finished ones.
_BULK_PICK: Final = f"""
SELECT id FROM (
  (SELECT id FROM jobs
   WHERE $6::text IS NOT NULL AND routing_key = $6 AND id > $1 AND state IN ($3, $4)
     AND {bulk_match("", 5)}
   ORDER BY id LIMIT $2)
  UNION ALL
  (SELECT id FROM jobs
   WHERE $6::text IS NULL AND $3 IN ('waiting', 'dead') AND rest = $3 AND id > $1
     AND {bulk_match("", 5)}
   ORDER BY id LIMIT $2)
  UNION ALL
  (SELECT id FROM jobs
   WHERE $6::text IS NULL AND $4 IN ('waiting', 'dead') AND rest = $4 AND id > $1
     AND {bulk_match("", 5)}
   ORDER BY id LIMIT $2)
  UNION ALL
  (SELECT id FROM (
       SELECT id FROM jobs
       WHERE $6::text IS NULL AND 'scheduled' IN ($3, $4) AND state = 'scheduled' AND id > $1
         AND {bulk_match("", 5)}
       OFFSET 0) AS scheduled
   ORDER BY id LIMIT $2)
) AS candidates
ORDER BY id
LIMIT $2
"""

# A batch is two statements. The first picks the batch's jobs and takes the fence of their shards
# (sql/0029): their rows of shard_epochs, FOR NO KEY UPDATE, in shard order, so that a claim of
# those shards under way commits first and none starts until the batch commits. It answers one
# row: how many jobs it looked at (``seen``: fewer than $2, the last batch), the last id it looked
# at (the new cursor), the ids, and the shards fenced. $1-$13 as _BULK_PICK.
BULK_FENCE: Final = f"""
WITH picked AS ({_BULK_PICK}),
fenced AS (
    SELECT se.shard FROM shard_epochs se
    WHERE se.shard IN (SELECT j.shard FROM jobs j WHERE j.id IN (SELECT id FROM picked))
    ORDER BY se.shard
    FOR NO KEY UPDATE OF se
)
SELECT (SELECT count(*) FROM picked) AS seen,
       (SELECT id FROM picked ORDER BY id DESC LIMIT 1) AS last,
       ARRAY(SELECT id FROM picked) AS ids,
       ARRAY(SELECT shard FROM fenced) AS shards
"""

# The second, in a snapshot taken once the fence is held, changes the picked jobs ($1) still on a
# fenced shard ($2), in the states ($3, $4) and matching the filter ($5-$13, ``bulk_match``): each
# is re-tested as it is locked, in id order as every statement locking several jobs takes them (a
# claim, a cancel or a requeue committed meanwhile is seen: such a job is left alone). Each
# changed job gets a history step by 'dispatcher' (consumer: $14, the node) with the detail $15
# naming the action. It answers one row: how many it changed, and the time of its transaction.
_BULK_PICKED: Final = "picked AS (SELECT unnest($1::uuid[]) AS id)"

_BULK_ANSWER: Final = """
SELECT (SELECT count(*) FROM changed) AS changed, now() AS at
"""

_BULK_LOCKED: Final = f"""locked AS (
    SELECT j.id, j.dispatched_at FROM jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM picked)) AND j.shard = ANY ($2::int[])
      AND j.state IN ($3, $4) AND {bulk_match("j.", 5)}
    ORDER BY j.id
    FOR UPDATE
)"""

# The notes each action leaves in its jobs' histories, one event batch a statement ($14 node id,
# $15 detail): the jobs cancelled, rescheduled (to their new time), and requeued (with the
# dispatch each requeue replaces).
_NOTE_CANCELLED: Final = note_events(
    "changed", job_id="id", outcome="'cancelled'::text", consumer="$14::text", detail="$15::text"
)
_NOTE_RESCHEDULED: Final = note_events(
    "changed",
    job_id="id",
    outcome="'rescheduled'::text",
    consumer="$14::text",
    detail="""$15::text || ' to '
           || to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')""",
)
_NOTE_REQUEUED: Final = note_events(
    """(SELECT id, 'dispatched'::text AS outcome, dispatched_at AS at, NULL::text AS detail
    FROM locked WHERE dispatched_at IS NOT NULL
    UNION ALL
    SELECT id, 'requeued', now(), $15::text FROM locked) AS steps""",
    job_id="id",
    outcome="outcome",
    consumer="$14::text",
    at="at",
    detail="detail",
)

# Cancel: as CANCEL_JOB (the 0006 trigger cancels the jobs waiting for them in turn).
# $1-$15 as above.
BULK_CANCEL: Final = f"""
WITH {_BULK_PICKED},
{_BULK_LOCKED},
changed AS (
    UPDATE jobs j SET state = 'cancelled', lease_until = NULL, updated_at = now()
    FROM locked WHERE j.id = locked.id
    RETURNING j.id
), noted AS (
    {_NOTE_CANCELLED}
)
{_BULK_ANSWER}
"""

# Reschedule: as RESCHEDULE_JOB, to $16 (or each job's run_at moved by $17 seconds, never before
# 1970, where the scans of overdue jobs begin). A due notice for each job whose new time falls
# within $18 seconds from now (inside the window a node may have loaded already); a later one is
# loaded when its time comes near, and the entry a node holds at the old time claims nothing.
# $1-$15 as above (' to <new time>' is added to the detail).
BULK_RESCHEDULE: Final = f"""
WITH {_BULK_PICKED},
{_BULK_LOCKED},
changed AS (
    UPDATE jobs j
    SET run_at = coalesce($16::timestamptz, greatest(j.run_at + make_interval(secs => $17),
                                                     'epoch'::timestamptz)),
        updated_at = now()
    FROM locked WHERE j.id = locked.id
    RETURNING j.id, j.shard, j.run_at, j.routing_key
), noted AS (
    {_NOTE_RESCHEDULED}
)
SELECT (SELECT count(*) FROM changed) AS changed, now() AS at,
       (SELECT count(dispatcher_notify_due_v1(id, shard, run_at, routing_key)) FROM changed
        WHERE run_at <= now() + make_interval(secs => $18)) AS notified
"""

# Requeue: as REQUEUE_DEAD_JOB (a new dispatch round, due now; the history keeps the dispatch
# replaced), each job moved to one of the shards $16 this node owns unless on one already, so
# that this node's loader walks them with a catch-up cursor (``Loader.catch_up``) at the
# catch-up pace beside the jobs falling due: no due notice per job. ($16 empty: shards kept.)
# $1-$15 as above.
BULK_REQUEUE: Final = f"""
WITH {_BULK_PICKED},
{_BULK_LOCKED},
changed AS (
    UPDATE jobs j
    SET state = 'scheduled', run_at = now(),
        shard = CASE WHEN cardinality($16::int[]) = 0 OR j.shard = ANY ($16::int[]) THEN j.shard
                     ELSE ($16::int[])[1 + get_byte(uuid_send(j.id), 15) % cardinality($16)]
                END,
        last_error = NULL, dispatched_at = NULL, lease_until = NULL, claimed_by = NULL,
        dispatch_round = gen_random_uuid(),
        updated_at = now()
    FROM locked WHERE j.id = locked.id
    RETURNING j.id
), noted AS (
    {_NOTE_REQUEUED}
)
{_BULK_ANSWER}
"""

# A dry run: how many jobs match now, up to $12 (a count past it stops: "at least"), each state
# from its index (scheduled jobs: jobs_due; waiting and dead ones: jobs_rest), and the first $2 of
# them in id order (whole rows). BULK_COUNT: $1, $2 states, $3-$11 as bulk_match,
# $12 the most it counts. BULK_SAMPLE: $1 the zero id, $2 sample size, $3-$13 as _BULK_PICK.
BULK_COUNT: Final = f"""
SELECT count(*) AS matched FROM (
    (SELECT FROM jobs
     WHERE 'scheduled' IN ($1, $2) AND state = 'scheduled' AND {bulk_match("", 3)} LIMIT $12)
    UNION ALL
    (SELECT FROM jobs
     WHERE $1 IN ('waiting', 'dead') AND rest = $1 AND {bulk_match("", 3)} LIMIT $12)
    UNION ALL
    (SELECT FROM jobs
     WHERE $2 IN ('waiting', 'dead') AND rest = $2 AND {bulk_match("", 3)} LIMIT $12)
    LIMIT $12
) AS capped
"""

BULK_SAMPLE: Final = f"""
SELECT * FROM jobs WHERE id = ANY (ARRAY({_BULK_PICK})) ORDER BY id
"""

# The columns of an action that its maker gives, in ``store.bulk_actions``'s order.
BULK_ACTION_COLUMNS: Final = (
    "id",
    "action",
    "namespace",
    "states",
    "routing_key",
    "routing_key_prefix",
    "run_at_from",
    "run_at_to",
    "finished_from",
    "finished_to",
    "error_contains",
    "run_at",
    "shift_s",
    "scope_prefixes",
    "created_by",
    "matched_estimate",
    "by_operator",
)

# Store a new action, running. $1..$17: BULK_ACTION_COLUMNS.
INSERT_BULK_ACTION: Final = (
    f"INSERT INTO bulk_actions ({', '.join(BULK_ACTION_COLUMNS)})"
    f" VALUES ({', '.join(f'${n}' for n in range(1, len(BULK_ACTION_COLUMNS) + 1))})"
    " RETURNING *"
)

# The next statements of the transaction end past $1 (text: '5s', '250ms'): a bulk read or batch
# that would run long is cut short by the server, which tells it from the server being away.
LIMIT_STATEMENT_TIME: Final = "SELECT set_config('statement_timeout', $1, true)"

# One namespace's budget of actions (an operator's apart) is counted and used by one transaction
# at a time: two makers cannot both take its last place. $1 namespace (NULL: every one), $2 by an
# operator.
LOCK_BULK_BUDGET: Final = """
SELECT pg_advisory_xact_lock(hashtext('dispatcher.bulk_actions'),
                             hashtext(coalesce($1::text, '*') || ':' || $2::boolean::text))
"""

BULK_BUDGET: Final = """
SELECT count(*) FILTER (WHERE status = 'running') AS running, count(*) AS stored
FROM bulk_actions WHERE coalesce(namespace, '*') = coalesce($1::text, '*') AND by_operator = $2
"""

# The actions done, failed or stopped longer than $1 seconds ago. Answers how many went.
REMOVE_ENDED_BULK_ACTIONS: Final = """
WITH removed AS (
    DELETE FROM bulk_actions
    WHERE status <> 'running' AND updated_at < now() - make_interval(secs => $1)
    RETURNING 1
)
SELECT count(*) FROM removed
"""


# The actions a caller may see, read, stop and resume: those whose jobs are all jobs it could act
# on one by one. Its namespace (NULL: every one, an admin's; '' the default one: an action for
# every namespace, NULL, is an admin's alone) and, for a key limited to routing-key prefixes (the
# words of $n+1; NULL: any), an action made by a key as limited or more (each of its scope's
# words within one of the caller's), or one whose filter names a routing key or prefix within
# them. $n namespace filter, $n+1 routing-key filter.
def bulk_visible(first: int) -> str:
    namespace, scope = f"${first}", f"${first + 1}"
    return f"""({namespace}::text IS NULL OR namespace = {namespace})
  AND ({scope}::text[] IS NULL
       OR (scope_prefixes IS NOT NULL AND NOT EXISTS (
             SELECT FROM unnest(scope_prefixes) AS s
             WHERE NOT EXISTS (SELECT FROM unnest({scope}::text[]) AS w
                               WHERE s = w OR starts_with(s, w || '.'))))
       OR EXISTS (
             SELECT FROM unnest({scope}::text[]) AS w
             WHERE routing_key = w OR starts_with(routing_key, w || '.')
                OR routing_key_prefix = w OR starts_with(routing_key_prefix, w || '.')))"""


# $1 id, $2-$3 as bulk_visible.
SELECT_BULK_ACTION: Final = f"""
SELECT * FROM bulk_actions WHERE id = $1 AND {bulk_visible(2)}
"""

# The newest $1 actions a caller may see, before the id $4 (NULL: the newest). $2-$3 as
# bulk_visible.
LIST_BULK_ACTIONS: Final = f"""
SELECT * FROM bulk_actions
WHERE {bulk_visible(2)} AND ($4::uuid IS NULL OR id < $4)
ORDER BY id DESC
LIMIT $1
"""

# Stop a running action (its worker sees it at its next batch: this waits for a batch in flight),
# or resume a stopped or failed one from its cursor. $1 id, $2-$3 as bulk_visible.
STOP_BULK_ACTION: Final = f"""
UPDATE bulk_actions SET status = 'stopped', worked_by = NULL, lease_until = NULL,
                        updated_at = now()
WHERE id = $1 AND {bulk_visible(2)} AND status = 'running'
RETURNING *
"""

RESUME_BULK_ACTION: Final = f"""
UPDATE bulk_actions SET status = 'running', reason = NULL, finished_at = NULL, updated_at = now()
WHERE id = $1 AND {bulk_visible(2)} AND status IN ('stopped', 'failed')
RETURNING *
"""

# Take a running action no other node works (its lease ran out, or it never had one) for $2
# seconds, for its next batch: an operator's first, then one of the namespace whose last batch ran
# longest ago, then that namespace's least recently worked action (bulk.py, "Bounds"); rows
# locked by a batch in flight are passed over. $1 node id.
CLAIM_BULK_ACTION: Final = """
UPDATE bulk_actions SET worked_by = $1, lease_until = now() + make_interval(secs => $2)
WHERE id = (
    SELECT a.id FROM bulk_actions a
    WHERE a.status = 'running'
      AND (a.lease_until IS NULL OR a.lease_until < now() OR a.worked_by = $1)
    ORDER BY a.by_operator DESC,
             (SELECT max(b.turn_at) FROM bulk_actions b
              WHERE coalesce(b.namespace, '*') = coalesce(a.namespace, '*')
                AND b.by_operator = a.by_operator) NULLS FIRST,
             a.turn_at NULLS FIRST, a.created_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING *
"""

# A batch starts by locking its action: it goes on only while the action runs and is worked by
# this node ($2), so a stop, or another node that took the action over, ends it between batches.
# $1 id.
LOCK_BULK_ACTION: Final = """
SELECT * FROM bulk_actions WHERE id = $1 AND status = 'running' AND worked_by = $2 FOR UPDATE
"""

# A batch ends by moving the cursor to $2 (NULL: where it is), counting $3 more jobs changed,
# noting its turn, and renewing the lease for $5 seconds (the node keeps the action while it
# rests: one node works an action at a time, at its rate); $4: no job is left, the action is done.
ADVANCE_BULK_ACTION: Final = """
UPDATE bulk_actions
SET cursor = coalesce($2, cursor), touched = touched + $3,
    status = CASE WHEN $4 THEN 'done' ELSE status END,
    finished_at = CASE WHEN $4 THEN now() END,
    worked_by = CASE WHEN $4 THEN NULL ELSE worked_by END,
    lease_until = CASE WHEN $4 THEN NULL ELSE now() + make_interval(secs => $5) END,
    turn_at = now(), updated_at = now()
WHERE id = $1
"""

# A node that takes another action's turn lets go of the one it held: any node may take it. $1 id,
# $2 node id.
RELEASE_BULK_ACTION: Final = """
UPDATE bulk_actions SET worked_by = NULL, lease_until = NULL
WHERE id = $1 AND worked_by = $2 AND status = 'running'
"""

# An action that cannot go on (its batch keeps failing on its jobs): failed with the reason $3,
# unless stopped meanwhile. $1 id, $2 node id.
FAIL_BULK_ACTION: Final = """
UPDATE bulk_actions SET status = 'failed', reason = $3, worked_by = NULL, lease_until = NULL,
                        finished_at = now(), updated_at = now()
WHERE id = $1 AND status = 'running' AND worked_by = $2
"""
