"""Every SQL statement the service runs, as named constants. Only ``store`` runs them."""

import dataclasses
from typing import Final

from dispatcher import models

# --- jobs: intake -------------------------------------------------------------------------------

# The columns intake writes, each with the type its parameter is cast to, in the order of
# ``dispatcher_enqueue_v1``'s arrays (sql/0012). INSERT_JOBS and INSERT_JOB are built from it once,
# here (no value is ever formatted into them), and ``store.jobs`` builds their parameters from it.
INSERTED_COLUMNS: Final = (
    ("id", "uuid"),
    ("shard", "int"),
    ("routing_key", "text"),
    ("payload", "bytea"),
    ("headers", "jsonb"),  # JSON text
    ("priority", "smallint"),
    ("ttl_ms", "bigint"),
    ("idempotency_key", "text"),
    ("run_at", "timestamptz"),
    ("namespace", "text"),  # NULL: the default namespace
)
_INSERTED_NAMES = [name for name, _ in INSERTED_COLUMNS]
_INSERTED_PARAMETERS = [
    f"${number}::{sql_type}" for number, (_, sql_type) in enumerate(INSERTED_COLUMNS, 1)
]
# The contract function takes the id hashes right after the shards: NULL, as the dispatcher
# chooses every shard itself.
_ENQUEUE_ARRAYS = [f"{parameter}[]" for parameter in _INSERTED_PARAMETERS]
_ENQUEUE_ARRAYS.insert(_INSERTED_NAMES.index("shard") + 1, "NULL")

# Insert a batch in one round trip, through the contract function (sql/0012) the SDK's enqueue
# calls too; an idempotency key seen before in the namespace inserts nothing. The dispatcher
# chooses every shard itself and sends no due notice (it puts the jobs on its heap). Only what the
# caller does not know already comes back (decoding whole rows cost more than the insert).
# $1..$10: INSERTED_COLUMNS, each a parallel array. As built:
#   SELECT id, created_at FROM dispatcher_enqueue_v1($1::uuid[], $2::int[], NULL, $3::text[],
#       ..., $10::text[], false)
INSERT_JOBS: Final = (
    "SELECT id, created_at\nFROM dispatcher_enqueue_v1("
    + ", ".join([*_ENQUEUE_ARRAYS, "false"])
    + ")\n"
)

# One job, as INSERT_JOBS would insert it (the same columns, and the idempotency rule of
# ``dispatcher_enqueue_v1``, which a test holds equal) in a plain statement: a sequential
# producer's request waits on this one, and PostgreSQL runs it in about three quarters of the
# contract function's time for a single row (no plpgsql call, no unnest).
# $1..$10: INSERTED_COLUMNS, one value each. As built:
#   INSERT INTO jobs (id, ..., namespace) VALUES ($1::uuid, ..., $10::text)
#   ON CONFLICT ((coalesce(namespace, '')), idempotency_key) WHERE idempotency_key IS NOT NULL
#   DO NOTHING RETURNING id, created_at
INSERT_JOB: Final = (
    "INSERT INTO jobs ("
    + ", ".join(_INSERTED_NAMES)
    + ")\nVALUES ("
    + ", ".join(_INSERTED_PARAMETERS)
    + ")\n"
    + """ON CONFLICT ((coalesce(namespace, '')), idempotency_key) WHERE idempotency_key IS NOT NULL
DO NOTHING
RETURNING id, created_at
"""
)

# Jobs as ``dispatcher_enqueue_v2`` (sql/0019) inserts or changes them: a new job, or the pending
# one its idempotency key names, replaced or extended, as each job's on_existing asks; one row
# per job in order, with its outcome (``models.Outcome``). Changed jobs are noticed (their owner
# may hold the old time in memory); new ones are not (intake offers them to its heap).
# $1..$10: INSERTED_COLUMNS, each a parallel array; $11 key releases (NULL: never); $12
# on_existing; $13 the node id (the history's actor).
ENQUEUE_JOBS: Final = (
    "SELECT ordinal, id, created_at, outcome\nFROM dispatcher_enqueue_v2("
    + ", ".join([*_ENQUEUE_ARRAYS, "$11::text[]", "$12::text[]", "false", "$13::text"])
    + ")\n"
)

# Whole rows of these jobs. $1 ids.
SELECT_JOBS: Final = "SELECT * FROM jobs WHERE id = ANY ($1::uuid[])\n"

# The jobs already stored under these idempotency keys, each in its namespace.
# $1 namespaces ('' for the default one), $2 keys: parallel arrays.
SELECT_BY_IDEMPOTENCY_KEYS: Final = """
SELECT j.* FROM jobs j
JOIN unnest($1::text[], $2::text[]) AS k(namespace, idempotency_key)
  ON coalesce(j.namespace, '') = k.namespace AND j.idempotency_key = k.idempotency_key
"""

# --- jobs: reads and cancel ---------------------------------------------------------------------

# A namespace filter ($n below) is NULL for every namespace, '' for the default one, else its name.
# A routing-key filter is NULL for any routing key, else the words a key's prefixes name: a row is
# within one when its routing key is those words or starts with them and a dot (the rule of
# ``api_keys.within``, which a test holds equal to this one).

# $1 id, $2 namespace filter, $3 routing-key filter.
SELECT_JOB: Final = """
SELECT * FROM jobs WHERE id = $1 AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
  AND ($3::text[] IS NULL OR EXISTS (
      SELECT FROM unnest($3::text[]) AS w
      WHERE routing_key = w OR starts_with(routing_key, w || '.')))
"""

# A page in id (= creation) order. $1 state or NULL, $2 routing key or NULL, $3 after id, $4 limit,
# $5 namespace filter, $6 routing-key filter (the words a key's prefixes name; NULL: any), $7 the
# payload bytes a page may hold (it ends before the job that would start past them; ``found``
# says how many the filters found, so a page cut short is told from the last one), $8 routing-key
# prefix (words, as a key's: billing is billing and billing.*; NULL: any), tested as $6 is, with
# starts_with: no LIKE metacharacter, and correct in any collation, where a range on jobs_key
# would hold only in byte order (C). It rides the branch of the other filters: jobs_state carries
# the routing key, so a state's page is still index-only; alone it walks the primary key.
# One branch per filter, each reading its index (sql/0009): a branch whose test on the parameters
# alone fails is skipped at run time, so a generic plan of the prepared statement (which the
# plan cache may choose after five runs) still reads only the index the filter needs; one WHERE
# of "$1 IS NULL OR state = $1" tests would get a generic plan walking the primary key. Each
# branch finds ids only (index-only scans where it can): planned as whole rows, a state's page
# walked the primary key past every older row, because the planner cannot know that the rows of
# a state (scheduled, say) are the newest.
LIST_JOBS: Final = """
SELECT * FROM (
  SELECT *, count(*) OVER () AS found,  -- the page's jobs, and the payload bytes before each
         sum(octet_length(payload)) OVER (ORDER BY id) - octet_length(payload) AS bytes_before
  FROM jobs
  WHERE id = ANY (ARRAY(
      (SELECT id FROM jobs  -- a routing key, and state and namespace if given: jobs_key
       WHERE routing_key = $2 AND ($1::text IS NULL OR state = $1) AND id > $3
         AND ($5::text IS NULL OR coalesce(namespace, '') = $5)
         AND ($6::text[] IS NULL OR EXISTS (
             SELECT FROM unnest($6::text[]) AS w
             WHERE routing_key = w OR starts_with(routing_key, w || '.')))
         AND ($8::text IS NULL OR routing_key = $8 OR starts_with(routing_key, $8 || '.'))
       ORDER BY id LIMIT $4)
      UNION ALL
      (SELECT id FROM jobs  -- a state, and namespace if given: jobs_state
       WHERE $2::text IS NULL AND state = $1 AND id > $3
         AND ($5::text IS NULL OR coalesce(namespace, '') = $5)
         AND ($6::text[] IS NULL OR EXISTS (
             SELECT FROM unnest($6::text[]) AS w
             WHERE routing_key = w OR starts_with(routing_key, w || '.')))
         AND ($8::text IS NULL OR routing_key = $8 OR starts_with(routing_key, $8 || '.'))
       ORDER BY id LIMIT $4)
      UNION ALL
      (SELECT id FROM jobs  -- a named namespace: jobs_namespace
       WHERE $2::text IS NULL AND $1::text IS NULL AND namespace = nullif($5, '') AND id > $3
         AND ($6::text[] IS NULL OR EXISTS (
             SELECT FROM unnest($6::text[]) AS w
             WHERE routing_key = w OR starts_with(routing_key, w || '.')))
         AND ($8::text IS NULL OR routing_key = $8 OR starts_with(routing_key, $8 || '.'))
       ORDER BY id LIMIT $4)
      UNION ALL
      (SELECT id FROM jobs  -- every job, or the default namespace's: the primary key
       WHERE $2::text IS NULL AND $1::text IS NULL AND ($5::text IS NULL OR $5 = '')
         AND ($5::text IS NULL OR namespace IS NULL) AND id > $3
         AND ($6::text[] IS NULL OR EXISTS (
             SELECT FROM unnest($6::text[]) AS w
             WHERE routing_key = w OR starts_with(routing_key, w || '.')))
         AND ($8::text IS NULL OR routing_key = $8 OR starts_with(routing_key, $8 || '.'))
       ORDER BY id LIMIT $4)
  ))
) AS page
WHERE bytes_before < $7  -- a page ends past $7 bytes of payloads, after one job at least
ORDER BY id
"""

# Only a job still waiting can be cancelled; a claimed one may be in RabbitMQ already. A job
# waiting for its prerequisites too (the 0006 trigger cancels the jobs waiting for it in turn).
# $1 id, $2 namespace filter, $3 routing-key filter.
CANCEL_JOB: Final = """
UPDATE jobs SET state = 'cancelled', lease_until = NULL, updated_at = now()
WHERE id = $1 AND state IN ('scheduled', 'waiting')
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
# NULL (keep), $6 whether to set the priority, $7 the priority.
RESCHEDULE_JOB: Final = """
UPDATE jobs
SET run_at = coalesce($4, run_at), payload = coalesce($5, payload),
    priority = CASE WHEN $6 THEN $7::smallint ELSE priority END, updated_at = now()
WHERE id = $1 AND state IN ('scheduled', 'waiting')
  AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
  AND ($3::text[] IS NULL OR EXISTS (
      SELECT FROM unnest($3::text[]) AS w
      WHERE routing_key = w OR starts_with(routing_key, w || '.')))
RETURNING *, dispatcher_notify_due_v1(id, shard, run_at, routing_key)
"""

# --- jobs: scheduler ----------------------------------------------------------------------------

# Park jobs that nothing can publish (firing gave up on them, see ``firing/quarantine.py``):
# dead with the reason, which their history shows as the dispatcher's verdict; the jobs waiting
# for them are cancelled by the 0006 trigger, as for any dead job. $1 ids, $2 reasons (same
# order), $3 node id. Returns the jobs parked.
PARK_JOBS: Final = """
WITH parked AS (
    UPDATE jobs j
    SET state = 'dead', last_error = p.reason, lease_until = NULL, updated_at = now()
    FROM unnest($1::uuid[], $2::text[]) AS p(id, reason)
    WHERE j.id = p.id AND j.state IN ('scheduled', 'dispatching')
    RETURNING j.id, j.routing_key, j.publish_attempts, p.reason
), noted AS (
    INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group, consumer, error, at)
    SELECT gen_random_uuid(), id, 'dead', publish_attempts, 'dispatcher', $3, reason, now()
    FROM parked
)
SELECT id, routing_key FROM parked
"""


# Jobs a flow rule holds (``flow.rules``) stay scheduled and are passed over by the loads, the
# straggler look and the claims: two parameters from ``first`` on are ``rules.HeldKeys``'s rules
# (jsonb) and first words, both empty when nothing is held. The function is called only for a
# job whose routing key starts with a rule's first word: the rest cost one comparison against
# that short array. ``alias`` prefixes the job's columns.
def not_held(alias: str, first: int) -> str:
    rules, words = f"${first}", f"${first + 1}"
    return (
        f"(cardinality({words}::text[]) = 0"
        f" OR split_part({alias}routing_key, '.', 1) <> ALL({words}::text[])"
        f" OR NOT dispatcher_flow_held({alias}routing_key, {alias}namespace, {rules}::jsonb))"
    )


# Scheduled jobs of the owned shards after the keyset cursor, up to a horizon, in due order.
# $1 shards, $2 cursor run_at, $3 cursor id, $4 horizon, $5 limit, $6-$7 what flow
# rules hold (``not_held``).
LOAD_DUE: Final = f"""
SELECT id, shard, run_at, routing_key, priority FROM jobs
WHERE state = 'scheduled' AND (run_at, id) > ($2, $3) AND run_at <= $4 AND shard = ANY($1::int[])
  AND {not_held("", 6)}
ORDER BY run_at, id
LIMIT $5
"""

# The statements that change jobs named by id find them by id (jobs_pkey), and the sweep of
# leases by their ends (jobs_lease_until); all test the state row by row: ``_IN_FLIGHT`` is a
# CASE, which the planner cannot answer from an index. Written as ``state = 'dispatching'``, it
# let the planner read the whole 'dispatching' range of jobs_state or of a partial index
# instead, small in its statistics; but while a snapshot is held (a report, a pg_dump) that range
# keeps a dead entry for every job fired since, and the confirm's mark read 10 000 buffers a call
# after six minutes (bench/held_snapshot.py).
_IN_FLIGHT: Final = "CASE state WHEN 'dispatching' THEN true ELSE false END"

# Claimed jobs whose publish was never confirmed (crash, outage), their leases run out since $3
# (PostgreSQL's clock; the beginning of time for a full look), in the order they ran out, after
# the time of the look (one row at least: the time alone when none did).
# They are found through jobs_lease_until, in the range of lease ends since $3 only: that range
# is what bounds the look while a snapshot is held, when the index keeps a dead entry for every
# job fired since. lease_until is set exactly while a job is dispatching; the state is still
# tested, row by row (``_IN_FLIGHT``), so that no index of states matches instead.
# $1 shards, $2 limit, $3 the lower bound.
EXPIRED_LEASES: Final = f"""
SELECT now() AS looked_at, expired.id, expired.shard, expired.run_at, expired.routing_key,
       expired.priority
FROM (VALUES (1)) AS one(n)
LEFT JOIN LATERAL (
    SELECT id, shard, run_at, routing_key, priority, lease_until FROM jobs
    WHERE lease_until >= $3 AND lease_until < now() AND {_IN_FLIGHT}
      AND shard = ANY($1::int[])
    ORDER BY lease_until
    LIMIT $2
) AS expired ON true
ORDER BY expired.lease_until
"""

# Claims made under an older epoch of a shard this node now holds: their owner died (a restarted
# node takes its shards under new epochs too) or lost the shard. A dead owner's are re-fired at
# once rather than when their lease runs out. A live owner's (a node still in the cluster, or
# this very process under an epoch it took) may be published and about to be marked: each is
# ripe once it is $6 seconds short of its lease, that is once its owner has had the time to
# settle it (confirmed and marked, or released), and a claim in flight is not published twice.
# A claim under this node's id made before this process first took the shard is a dead
# process's. ripe_in_s: how long until it is ripe (0: now).
# $1 shards held, $2 their epochs, $3 the first epoch this process took each under (same order),
# $4 this node's id, $5 the other nodes in the cluster, $6 seconds, $7 limit.
ORPHANED_CLAIMS: Final = """
SELECT j.id, j.shard, j.run_at, j.routing_key, j.priority,
       CASE WHEN CASE WHEN j.claimed_by = $4 THEN j.claim_epoch >= held.first_epoch
                      ELSE j.claimed_by = ANY($5::text[]) END
            THEN greatest(0, extract(epoch FROM j.lease_until - now()) - $6)::float8
            ELSE 0::float8
       END AS ripe_in_s
FROM jobs j
JOIN unnest($1::int[], $2::bigint[], $3::bigint[]) AS held(shard, epoch, first_epoch)
  ON j.shard = held.shard
WHERE j.state = 'dispatching' AND j.claim_epoch < held.epoch
ORDER BY j.run_at, j.id
LIMIT $7
"""

# Safety net: scheduled jobs of the owned shards overdue by more than a grace period, which no
# load put in memory (a job committed on a shard while it moved to another node, say).
# $1 shards, $2 grace seconds, $3 limit, $4-$5 what flow rules hold (``not_held``).
OVERDUE_STRAGGLERS: Final = f"""
SELECT id, shard, run_at, routing_key, priority FROM jobs
WHERE state = 'scheduled' AND run_at < now() - make_interval(secs => $2)
  AND shard = ANY($1::int[]) AND {not_held("", 4)}
ORDER BY run_at, id
LIMIT $3
"""

# The columns of a claimed job: ``models.Claimed``'s fields, in their order. CLAIM_JOBS returns
# them after its two clocks, and ``store.jobs`` decodes its rows by position from this tuple.
CLAIMED_COLUMNS: Final = tuple(field.name for field in dataclasses.fields(models.Claimed))

# Claim due jobs for publishing, fenced: a row is claimed only while the shard's epoch is the one
# this node holds, and the epoch rows are share-locked so a concurrent takeover (which bumps them)
# waits for this claim to commit or happens entirely before it.
# Each id comes with the run_at its heap entry was made for: a job rescheduled later since then is
# not claimed by the stale entry (the entry of the new time claims it). A reschedule racing with
# the claim either commits first (the claim re-reads the row and skips it) or waits for the claim
# and then finds the job dispatching.
# The plan must look each id up by the primary key whatever the table's statistics: the fence is
# folded into one array (an InitPlan run once), because as a joined relation the planner looped
# over it, repeating the lookups once per shard (128k index scans for 500 jobs). The state test
# is a CASE, not an OR of states, which would match a partial index instead.
# A job stored before migration 0011 gets its dispatch round here (a re-claim keeps the round:
# the same dispatch, published again).
# The clock fence: a job is claimed only once PostgreSQL's own clock, read once at the start (the
# first column), is within $7 seconds of its run_at: a node whose idea of the time is ahead cannot
# talk it round. The second column reads the clock again as the answer is made: a claimed job is
# published no earlier than its run_at by that reading. One row at least, the clocks alone, when
# nothing was claimed.
# $1 ids, $2 shards held (those of the ids), $3 their epochs (same order), $4 node id, $5 lease
# seconds, $6 the entries' run_at (POSIX seconds, same order as $1), $7 the fence's tolerance
# (seconds), $8-$9 what flow rules hold (``not_held``): a scheduled job held since its entry
# was loaded is skipped (and loaded again when released), unless it is one of $10, the ids a
# flow rule's meter let go; a claim run out is re-fired regardless (it was dispatched once
# already).
# Each row: the two clocks, then CLAIMED_COLUMNS.
CLAIM_JOBS: Final = (
    """
WITH read_at AS (
    SELECT clock_timestamp() AS db_now
),
locked AS (
    SELECT se.shard
    FROM shard_epochs se
    JOIN unnest($2::int[], $3::bigint[]) AS held(shard, epoch)
      ON se.shard = held.shard AND se.epoch = held.epoch
    FOR SHARE OF se
),
fence AS (
    SELECT coalesce(array_agg(shard), '{}') AS shards FROM locked
),
claimed AS (
    UPDATE jobs j
    SET state = 'dispatching', lease_until = now() + make_interval(secs => $5),
        claim_epoch = ($3::bigint[])[array_position($2::int[], j.shard)], claimed_by = $4,
        publish_attempts = j.publish_attempts + 1, updated_at = now(),
        dispatch_round = coalesce(j.dispatch_round, gen_random_uuid())
    FROM unnest($1::uuid[], $6::float8[]) AS wanted(id, run_at_s)
    WHERE j.id = wanted.id
      AND j.run_at <= to_timestamp(wanted.run_at_s) + interval '1 millisecond'
      AND j.run_at <= (SELECT db_now FROM read_at) + make_interval(secs => $7)
      AND j.shard = ANY((SELECT shards FROM fence)::int[])
      AND CASE j.state
            WHEN 'scheduled' THEN j.id = ANY($10::uuid[]) OR """
    + not_held("j.", 8)
    + """
            -- a lease run out, or a claim of an earlier epoch (ORPHANED_CLAIMS)
            WHEN 'dispatching' THEN j.lease_until < now()
                OR j.claim_epoch < ($3::bigint[])[array_position($2::int[], j.shard)]
            ELSE false
          END
    RETURNING """
    + ", ".join(f"j.{column}" for column in CLAIMED_COLUMNS)
    + """
)
SELECT extract(epoch FROM read_at.db_now)::float8, extract(epoch FROM clock_timestamp())::float8,
       claimed.*
FROM read_at LEFT JOIN claimed ON true
"""
)


# RabbitMQ confirmed these. $1 ids. SETTLE_REPORTED follows in the same transaction.
MARK_DISPATCHED: Final = f"""
UPDATE jobs SET state = 'dispatched', dispatched_at = now(), lease_until = NULL, updated_at = now()
WHERE id = ANY($1::uuid[]) AND {_IN_FLIGHT}
"""

# Events never move a job in 'dispatching', and a fast consumer's may be recorded before the
# confirm is marked: the jobs MARK_DISPATCHED just marked take the final outcome their consumers
# reported last for this round, in the order received (RECORD_EVENTS; events recorded before
# migration 0014 have no order and come first, by their own times). A statement of its own, after
# MARK_DISPATCHED locked the rows, so that its snapshot holds every event recorded meanwhile
# (RECORD_EVENTS locks the job of a final event: it either commits before the mark's lock, or
# waits and finds it dispatched).
# Planned at each run (PLAN_EACH_RUN): a new database's first confirms find no events, and the
# generic plan PostgreSQL would cache then reads all of job_events, which grows by two rows a job.
# $1 ids.
SETTLE_REPORTED: Final = """
WITH reported AS (
    SELECT DISTINCT ON (e.job_id) e.job_id, e.outcome, e.error
    FROM jobs j
    JOIN job_events e ON e.job_id = j.id AND e.round = j.dispatch_round
    WHERE j.id = ANY($1::uuid[]) AND j.state = 'dispatched'
      AND e.ignored IS NULL AND e.outcome IN ('succeeded', 'dead')
    ORDER BY e.job_id, e.received DESC NULLS LAST, e.at DESC
)
UPDATE jobs j SET state = reported.outcome, last_error = reported.error, updated_at = now()
FROM reported
WHERE j.id = reported.job_id AND j.state = 'dispatched'
"""

# The transaction's next statements are planned with their values each time they run, never from a
# plan cached for the prepared statement.
PLAN_EACH_RUN: Final = "SET LOCAL plan_cache_mode = force_custom_plan"

# Their ttl ran out before they could be published. $1 ids.
MARK_EXPIRED: Final = f"""
UPDATE jobs SET state = 'expired', lease_until = NULL, updated_at = now()
WHERE id = ANY($1::uuid[]) AND {_IN_FLIGHT}
"""

# The publish failed: give the claims back so they fire again. $1 ids, $2 node id.
RELEASE_CLAIMS: Final = f"""
UPDATE jobs SET state = 'scheduled', lease_until = NULL, claimed_by = NULL, updated_at = now()
WHERE id = ANY($1::uuid[]) AND {_IN_FLIGHT} AND claimed_by = $2
"""

# The same for claims of shards this node lost meanwhile: the new owner may have loaded past them
# already, so each is announced to it by a due notice (see ``store/due_notices.py``).
# $1 ids, $2 node id.
RELEASE_CLAIMS_ANNOUNCED: Final = f"""
WITH released AS (
    UPDATE jobs SET state = 'scheduled', lease_until = NULL, claimed_by = NULL, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND {_IN_FLIGHT} AND claimed_by = $2
    RETURNING id, shard, run_at, routing_key
)
SELECT count(dispatcher_notify_due_v1(id, shard, run_at, routing_key)) FROM released
"""

# --- job events and history ---------------------------------------------------------------------

# Record consumers' events once per event id (they arrive at-least-once), only for jobs that exist
# here, and move each job to the final state its last new final event names, last in the order
# received (the batch's order, never the consumer's own "at": it could date one ahead to win). An
# event is ignored (changing nothing) when, with grants given ($12..$14: DISPATCHER_EVENT_USERS),
# its message had no user_id (no_user) or its user holds no grant covering the job's namespace
# and routing key (publisher); when it names another dispatch round than the job's (other_round),
# none while the job has one (no_round: jobs dispatched before migration 0011 have none and take
# events without), or another routing key (routing_key). The first $15 ignored events of a job are
# kept in its history; the others are only counted (jobs.ignored_dropped), so that a flood of
# forgeries cannot grow a job's history without bound. A job is moved only from 'dispatched' or a
# final state: one still 'dispatching' takes its consumers' outcome at the confirm
# (SETTLE_REPORTED). The jobs of final events are locked first, in id order, and judged by their
# latest version (a confirm or a requeue committed meanwhile is seen), so that no outcome falls
# between this statement and the confirm's. Returns the events newly recorded or counted, and
# whether each was ignored, for the metrics.
# $1 event ids, $2 job ids, $3 outcomes, $4 attempts, $5 groups, $6 consumers, $7 errors, $8 times,
# $9 routing keys, $10 rounds (NULL: none), $11 publishers (the messages' user_id, NULL: none),
# $12 grant users, $13 grant namespaces (NULL: any), $14 grant prefixes (NULL: any), $15 ignored
# events kept per job.
RECORD_EVENTS: Final = """
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[], $5::text[], $6::text[],
                         $7::text[], $8::timestamptz[], $9::text[], $10::uuid[], $11::text[])
        WITH ORDINALITY
        AS e(event_id, job_id, outcome, attempt, consumer_group, consumer, error, at,
             routing_key, round, publisher, position)
), grants AS (
    SELECT * FROM unnest($12::text[], $13::text[], $14::text[]) AS g(publisher, namespace, prefix)
), locked AS (
    SELECT id, state, routing_key, dispatch_round, namespace FROM jobs
    WHERE id IN (SELECT job_id FROM batch WHERE outcome IN ('succeeded', 'dead'))
    ORDER BY id
    FOR NO KEY UPDATE
), current AS (
    SELECT * FROM locked
    UNION ALL
    SELECT id, state, routing_key, dispatch_round, namespace FROM jobs
    WHERE id IN (SELECT job_id FROM batch) AND id NOT IN (SELECT id FROM locked)
), judged AS (
    SELECT b.*,
           CASE
               WHEN cardinality($12::text[]) > 0 AND b.publisher IS NULL THEN 'no_user'
               WHEN cardinality($12::text[]) > 0 AND NOT EXISTS (
                   SELECT 1 FROM grants g
                   WHERE g.publisher = b.publisher
                     AND (g.namespace IS NULL OR g.namespace = j.namespace)
                     AND (g.prefix IS NULL OR j.routing_key = g.prefix
                          OR starts_with(j.routing_key, g.prefix || '.'))
               ) THEN 'publisher'
               WHEN b.round IS NULL AND j.dispatch_round IS NOT NULL THEN 'no_round'
               WHEN b.round IS DISTINCT FROM j.dispatch_round THEN 'other_round'
               WHEN b.routing_key IS DISTINCT FROM j.routing_key THEN 'routing_key'
           END AS ignored
    FROM batch b JOIN current j ON j.id = b.job_id
), ranked AS (
    -- An ignored event is kept while its job has fewer than $15 (only ignored ones count the
    -- job's stored events: an index range per ignored event, none per counted one).
    SELECT judged.*,
           CASE WHEN ignored IS NULL THEN true
                ELSE row_number() OVER (PARTITION BY job_id, ignored IS NULL ORDER BY position)
                     + (SELECT count(*) FROM job_events e
                        WHERE e.job_id = judged.job_id AND e.ignored IS NOT NULL) <= $15
           END AS kept
    FROM judged
), inserted AS (
    INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group, consumer, error, at,
                            round, ignored, received)
    -- nextval after the sort: the batch's order becomes the order received.
    SELECT event_id, job_id, outcome, attempt, consumer_group, consumer, error, at, round, ignored,
           nextval('job_events_received')
    FROM ranked WHERE kept
    ORDER BY position
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, job_id, outcome, error, ignored, received
), dropped AS (
    -- Not kept, and not a copy of one kept before (a redelivery is counted once).
    SELECT event_id, job_id, ignored FROM ranked r
    WHERE NOT kept AND NOT EXISTS (SELECT 1 FROM job_events e WHERE e.event_id = r.event_id)
), final AS (
    SELECT DISTINCT ON (i.job_id) i.job_id, i.outcome, i.error FROM inserted i
    JOIN locked ON locked.id = i.job_id
    WHERE i.ignored IS NULL AND i.outcome IN ('succeeded', 'dead')
      AND locked.state IN ('dispatched', 'succeeded', 'dead')
    ORDER BY i.job_id, i.received DESC
), changes AS (
    -- One update a job (a statement cannot change a row twice): its outcome and its count.
    SELECT coalesce(f.job_id, d.job_id) AS job_id, f.outcome, f.error,
           coalesce(d.events, 0) AS dropped
    FROM final f
    FULL JOIN (SELECT job_id, count(*) AS events FROM dropped GROUP BY job_id) d
        ON d.job_id = f.job_id
), moved AS (
    -- No test of the state here: the scan's snapshot may predate the version locked above.
    UPDATE jobs j
    SET state = coalesce(c.outcome, j.state),
        last_error = CASE WHEN c.outcome IS NULL THEN j.last_error ELSE c.error END,
        lease_until = CASE WHEN c.outcome IS NULL THEN j.lease_until END,
        dispatched_at = CASE WHEN c.outcome IS NULL THEN j.dispatched_at
                             ELSE coalesce(j.dispatched_at, now()) END,
        updated_at = CASE WHEN c.outcome IS NULL THEN j.updated_at ELSE now() END,
        ignored_dropped = j.ignored_dropped + c.dropped
    FROM changes c
    WHERE j.id = c.job_id
)
SELECT event_id, ignored FROM inserted
UNION ALL
SELECT event_id, ignored FROM dropped
"""

# A job's events in the order they happened (by their consumers' clocks), each with how many of
# the job's ignored events were only counted (the same on every row; with none kept, none were):
# the steps that frame the rounds (a requeue and the dispatch it replaced) and the $2 newest of
# the others (the consumers' events, and the dispatcher's changes to a pending job: a key
# replaced a thousand times shows its last changes), with how many others there are. $1 job id,
# $2 the most of those shown.
SELECT_JOB_EVENTS: Final = """
SELECT outcome, attempt, consumer_group, consumer, error, at, ignored, detail, ignored_dropped,
       reported
FROM (
  SELECT e.*, (SELECT ignored_dropped FROM jobs WHERE id = $1) AS ignored_dropped,
         count(*) FILTER (WHERE outcome NOT IN ('dispatched', 'requeued')) OVER () AS reported,
         row_number() OVER (PARTITION BY outcome IN ('dispatched', 'requeued')
                            ORDER BY at DESC, attempt DESC) AS newest
  FROM job_events e
  WHERE job_id = $1
) AS history
WHERE outcome IN ('dispatched', 'requeued') OR newest <= $2
ORDER BY at, attempt, outcome <> 'started'
"""

# Put a dead job back on the schedule, due now, on a shard this node owns (so it fires from here),
# as a new dispatch round (events of the earlier ones are ignored from now on). Its history keeps
# the dispatch being replaced (the row holds only the latest) and notes the requeue.
# $1 id, $2 namespace filter, $3 routing-key filter, $4 shard, $5 node id.
REQUEUE_DEAD_JOB: Final = """
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
    INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group, consumer, at)
    SELECT gen_random_uuid(), id, 'dispatched', 0, 'dispatcher', $5, dispatched_at
    FROM old WHERE dispatched_at IS NOT NULL
    UNION ALL
    SELECT gen_random_uuid(), id, 'requeued', 0, 'dispatcher', $5, now() FROM old
)
SELECT * FROM requeued
"""

# --- retention and statistics --------------------------------------------------------------------

# Delete a small batch of jobs finished longer ago than the retention, with their events; locked
# rows are skipped (a requeue in flight), so no statement holds many locks for long.
# $1 retention seconds, $2 batch size. Returns the ids deleted.
DELETE_FINISHED: Final = """
WITH doomed AS (
    SELECT id FROM jobs
    WHERE state IN ('dispatched', 'succeeded', 'dead', 'cancelled', 'expired')
      AND updated_at < now() - make_interval(secs => $1)
    ORDER BY updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM job_events e USING doomed WHERE e.job_id = doomed.id
)
DELETE FROM jobs j USING doomed WHERE j.id = doomed.id RETURNING j.id
"""

# Job counts (see dispatcher/housekeeping.py): one node at a time counts, under this lock, the
# states whose last count is old enough, and every node reads the result from job_counts.
# Taken in the counting transaction (released at its end); false while another node counts.
TRY_COUNT_LOCK: Final = "SELECT pg_try_advisory_xact_lock(hashtext('dispatcher.job_counts'))"

# The states to count now: never counted, or counted longer ago than both $2 seconds and $3 times
# what their last count took. $1 every state.
STATES_TO_COUNT: Final = """
SELECT s.state FROM unnest($1::text[]) AS s(state)
LEFT JOIN job_counts c ON c.state = s.state
WHERE c.state IS NULL
   OR c.counted_at < now() - make_interval(secs => greatest($2::float8, c.count_s * $3::float8))
"""

# One state's jobs per routing key: the top $2 keys, most jobs first, and the rest summed; when
# the count started and how long it took (the columns SAVE_COUNT takes, in its order). An
# index-only scan of the state's range of jobs_state, never of the other states' rows. $1 state.
COUNT_STATE: Final = """
WITH counted AS (
    SELECT routing_key, count(*) AS jobs FROM jobs WHERE state = $1 GROUP BY routing_key
), ranked AS (
    SELECT routing_key, jobs, row_number() OVER (ORDER BY jobs DESC, routing_key) AS rank
    FROM counted
)
SELECT $1::text AS state,
       coalesce(array_agg(routing_key ORDER BY rank) FILTER (WHERE rank <= $2), '{}')
           AS routing_keys,
       coalesce(array_agg(jobs ORDER BY rank) FILTER (WHERE rank <= $2), '{}') AS jobs,
       coalesce(sum(jobs) FILTER (WHERE rank > $2), 0)::bigint AS other_jobs,
       statement_timestamp() AS counted_at,
       extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS count_s
FROM ranked
"""

# $1 state, $2 routing keys, $3 their jobs, $4 other jobs, $5 counted at, $6 seconds it took.
SAVE_COUNT: Final = """
INSERT INTO job_counts (state, routing_keys, jobs, other_jobs, counted_at, count_s)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (state) DO UPDATE
SET routing_keys = excluded.routing_keys, jobs = excluded.jobs, other_jobs = excluded.other_jobs,
    counted_at = excluded.counted_at, count_s = excluded.count_s
"""

# The last counts, a row per state. No arguments.
SELECT_COUNTS: Final = """
SELECT state, routing_keys, jobs, other_jobs, counted_at FROM job_counts
"""

# The next scheduled jobs in due order (the jobs_due index). $1 limit.
NEXT_DUE: Final = """
SELECT id, routing_key, run_at FROM jobs WHERE state = 'scheduled' ORDER BY run_at, id LIMIT $1
"""

# The next scheduled jobs counted per minute and routing key, for the console: reads at most $3
# jobs in due order up to $1 seconds from now (an index-only range of jobs_due: a backlog of
# millions costs no more than $3 rows), then groups them. $1 window seconds, $2 groups, $3 jobs.
NEXT_DUE_BY_MINUTE: Final = """
SELECT date_trunc('minute', run_at) AS minute, routing_key, count(*)::bigint AS jobs
FROM (
    SELECT run_at, routing_key FROM jobs
    WHERE state = 'scheduled' AND run_at < now() + make_interval(secs => $1)
    ORDER BY run_at, id LIMIT $3
) AS due
GROUP BY 1, 2 ORDER BY 1, 2 LIMIT $2
"""

# The jobs of an idempotency key, in any namespace allowed by the filter: the one holding it in
# each namespace (jobs_idempotency_key_namespace), then the newest of those that let go of it
# (jobs_released_key). $1 key, $2 namespace filter, $3 routing-key filter.
SELECT_BY_IDEMPOTENCY_KEY: Final = """
SELECT * FROM (
  (SELECT *, false AS released FROM jobs WHERE idempotency_key = $1
     AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
     AND ($3::text[] IS NULL OR EXISTS (
         SELECT FROM unnest($3::text[]) AS w
         WHERE routing_key = w OR starts_with(routing_key, w || '.')))
   ORDER BY id LIMIT 10)
  UNION ALL
  (SELECT *, true AS released FROM jobs WHERE released_key = $1
     AND ($2::text IS NULL OR coalesce(namespace, '') = $2)
     AND ($3::text[] IS NULL OR EXISTS (
         SELECT FROM unnest($3::text[]) AS w
         WHERE routing_key = w OR starts_with(routing_key, w || '.')))
   ORDER BY id DESC LIMIT 10)
) AS found
ORDER BY released, CASE WHEN released THEN NULL ELSE id END, id DESC
LIMIT 10
"""

# --- shards -------------------------------------------------------------------------------------

# Create the epoch rows on first start. $1 shard count.
ENSURE_SHARDS: Final = """
INSERT INTO shard_epochs (shard) SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING
"""

COUNT_SHARDS: Final = "SELECT count(*) FROM shard_epochs"

# Take shards: a new epoch fences every claim made under the old one. $1 shards, $2 node id.
BUMP_EPOCHS: Final = """
UPDATE shard_epochs SET epoch = epoch + 1, owner = $2, updated_at = now()
WHERE shard = ANY($1::int[])
RETURNING shard, epoch
"""

# Current epochs (for status pages). No arguments.
SELECT_EPOCHS: Final = "SELECT shard, epoch, owner FROM shard_epochs ORDER BY shard"

# --- API keys -----------------------------------------------------------------------------------

# $1 token SHA-256, $2 name, $3 scope, $4 namespace or NULL, $5 routing-key prefixes. Tells every
# node on the channel 'dispatcher_keys' (delivered on commit): the first key closes the API at once.
INSERT_API_KEY: Final = """
WITH created AS (
    INSERT INTO api_keys (token_sha256, name, scope, namespace, routing_key_prefixes)
    VALUES ($1, $2, $3, $4, $5::text[])
    RETURNING id, name, scope, namespace, routing_key_prefixes, created_at, revoked_at
)
SELECT *, pg_notify('dispatcher_keys', 'created,' || id) FROM created
"""

# The live key with this token hash, if any. $1 token SHA-256.
SELECT_API_KEY: Final = """
SELECT id, name, scope, namespace, routing_key_prefixes, created_at, revoked_at
FROM api_keys WHERE token_sha256 = $1 AND revoked_at IS NULL
"""

# Every key, revoked ones too, without their hashes. No arguments.
LIST_API_KEYS: Final = """
SELECT id, name, scope, namespace, routing_key_prefixes, created_at, revoked_at
FROM api_keys ORDER BY id
"""

# $1 key id. Returns nothing when there is no such live key. Tells every node (a key notice, as
# for a creation) so that it is refused at once.
REVOKE_API_KEY: Final = """
WITH revoked AS (
    UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL RETURNING id
)
SELECT id, pg_notify('dispatcher_keys', 'revoked,' || id) FROM revoked
"""

# Whether a key was ever created (auth is on from then on). No arguments.
ANY_API_KEY: Final = "SELECT EXISTS (SELECT 1 FROM api_keys)"

# Every live key with its token hash: what a node holds in memory to answer any token without a
# query (``keyring``). No arguments.
LIVE_API_KEYS: Final = """
SELECT token_sha256, id, name, scope, namespace, routing_key_prefixes, created_at, revoked_at
FROM api_keys WHERE revoked_at IS NULL
"""

# --- migrations ---------------------------------------------------------------------------------

MIGRATION_LOCK: Final = "SELECT pg_advisory_lock(hashtext('dispatcher.migrations'))"
MIGRATION_UNLOCK: Final = "SELECT pg_advisory_unlock(hashtext('dispatcher.migrations'))"
CREATE_MIGRATIONS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text        PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text
"""
# Versions with the sha256 of the file applied (NULL: applied by a release that recorded none).
# Read through to_jsonb so that it also reads the table of such a release, which has no checksum
# column yet (a status check changes nothing).
APPLIED_MIGRATIONS: Final = """
SELECT m.version, to_jsonb(m) ->> 'checksum' AS checksum, m.applied_at FROM schema_migrations m
"""
# Whether anything was ever migrated here (the status check reads, never creates, the table).
MIGRATIONS_TABLE_EXISTS: Final = "SELECT to_regclass('schema_migrations') IS NOT NULL"
# $1 version, $2 checksum.
RECORD_MIGRATION: Final = "INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2)"
# Adopt the shipped files' checksums for versions recorded without one, in one statement.
# $1 versions, $2 their checksums (parallel arrays).
ADOPT_MIGRATION_CHECKSUMS: Final = """
UPDATE schema_migrations m SET checksum = shipped.checksum
FROM unnest($1::text[], $2::text[]) AS shipped(version, checksum)
WHERE m.version = shipped.version AND m.checksum IS NULL
"""

PING: Final = "SELECT 1"
# PostgreSQL's clock as it is read (not the transaction's start, which now() gives), in POSIX
# seconds: the node's time source (timekeeper.py).
READ_CLOCK: Final = "SELECT extract(epoch FROM clock_timestamp())::float8"

# --- what holds vacuum back (vacuum_watch.py) ---------------------------------------------------

# The oldest snapshots that keep vacuum from removing dead rows, oldest xmin first: sessions (a
# report's open transaction, a pg_dump, a standby's feedback through its walsender), prepared
# transactions, and replication slots (an idle logical consumer). held_s: how long PostgreSQL
# says each has been held (unknown for a slot, and for other roles' sessions unless this role has
# pg_read_all_stats, as pg_monitor gives: SEES_ALL_SESSIONS says whether it does). $1 limit.
OLDEST_SNAPSHOTS: Final = """
SELECT kind, holder, xmin, xmin_age, held_s FROM (
    SELECT 'session' AS kind,
           format('pid %s (%s%s)', pid, coalesce(nullif(application_name, ''), backend_type),
                  coalesce(', ' || state, '')) AS holder,
           backend_xmin::text AS xmin, age(backend_xmin) AS xmin_age,
           extract(epoch FROM now() - coalesce(xact_start, query_start))::float8 AS held_s
    FROM pg_stat_activity
    WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
    UNION ALL
    SELECT 'prepared transaction', gid, transaction::text, age(transaction),
           extract(epoch FROM now() - prepared)::float8
    FROM pg_prepared_xacts
    UNION ALL
    SELECT 'replication slot', slot_name::text, xmin::text, age(xmin), NULL
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL
) AS holders
ORDER BY xmin_age DESC
LIMIT $1
"""

SEES_ALL_SESSIONS: Final = "SELECT pg_has_role('pg_read_all_stats', 'USAGE')"

# --- job dependencies (sql/0006, 0010: the trigger that releases or cancels dependents) ---------

# Lock the prerequisites a submission names, in id order (so two submissions cannot deadlock on
# them), and mark them as having dependents. The lock makes a prerequisite's state change wait for
# the submission to commit (its trigger then sees the new edges), or the submission read the state
# that change committed: either way no dependent misses its release.
# $1 prerequisite ids, $2 the namespace they must be in ('' for the default one), $3 the
# routing-key filter of the submitter's key (a job outside it is not found, as a random id).
LOCK_PREREQUISITES: Final = """
WITH locked AS (
    SELECT id, state, has_dependents FROM jobs
    WHERE id = ANY($1::uuid[]) AND coalesce(namespace, '') = $2
      AND ($3::text[] IS NULL OR EXISTS (
          SELECT FROM unnest($3::text[]) AS w
          WHERE routing_key = w OR starts_with(routing_key, w || '.')))
    ORDER BY id
    FOR NO KEY UPDATE
), flagged AS (
    UPDATE jobs j SET has_dependents = true FROM locked
    WHERE j.id = locked.id AND NOT locked.has_dependents
)
SELECT id, state FROM locked
"""

# $1 job ids, $2 prerequisite ids, $3 positions in `after`, $4 satisfied: parallel arrays.
INSERT_DEPENDENCIES: Final = """
INSERT INTO job_dependencies (job_id, prerequisite_id, position, satisfied)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::smallint[], $4::boolean[])
"""

# Jobs just inserted that wait for prerequisites not yet succeeded. $1 ids, $2 how many each.
MARK_WAITING: Final = """
UPDATE jobs j SET state = 'waiting', waiting_for = w.pending
FROM unnest($1::uuid[], $2::int[]) AS w(id, pending)
WHERE j.id = w.id
"""

# A job's prerequisites in the order it named them. $1 job id.
SELECT_PREREQUISITES: Final = """
SELECT prerequisite_id, satisfied FROM job_dependencies WHERE job_id = $1 ORDER BY position
"""

# The oldest follow-up the 0010 trigger deferred whose prerequisite has no older one waiting
# (a prerequisite's follow-ups are worked in order), locked for one batch; another node's is
# skipped. No arguments.
CLAIM_FOLLOWUP: Final = """
SELECT f.id, f.prerequisite_id, f.state, f.created_at, f.cursor FROM dependency_followups f
WHERE NOT EXISTS (
    SELECT 1 FROM dependency_followups earlier
    WHERE earlier.prerequisite_id = f.prerequisite_id AND earlier.id < f.id
)
ORDER BY f.id
LIMIT 1
FOR UPDATE SKIP LOCKED
"""

# One batch of a follow-up: the prerequisite's next dependents after the cursor, released or
# cancelled (sql/0010's dispatcher_follow_dependents, which the trigger follows them with too);
# the trigger a cancel fires follows that job's own dependents in turn. Returns followed,
# last_job_id, released, cancelled.
# $1 prerequisite id, $2 its state, $3 when it reached it, $4 cursor, $5 batch size.
FOLLOW_DEPENDENTS: Final = "SELECT * FROM dispatcher_follow_dependents($1, $2, $3, $4, $5)"

# $1 follow-up id, $2 the last dependent followed.
ADVANCE_FOLLOWUP: Final = "UPDATE dependency_followups SET cursor = $2 WHERE id = $1"

# Its last batch is done. $1 follow-up id.
DELETE_FOLLOWUP: Final = "DELETE FROM dependency_followups WHERE id = $1"

# --- recurring schedules ------------------------------------------------------------------------

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

# --- flow rules (store/flow_rules.py) ---------------------------------------------------------

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

# --- bulk actions (dispatcher/bulk.py, dispatcher/bulk_runner.py) ---------------------------------


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
# jobs_key (routing_key, id) from the cursor; otherwise each state its range of jobs_state
# (state, id): an IN of both states would read and sort every row of both after the cursor.
_BULK_PICK: Final = f"""
SELECT id FROM (
  (SELECT id FROM jobs
   WHERE $6::text IS NOT NULL AND routing_key = $6 AND id > $1 AND state IN ($3, $4)
     AND {bulk_match("", 5)}
   ORDER BY id LIMIT $2)
  UNION ALL
  (SELECT id FROM jobs
   WHERE $6::text IS NULL AND state = $3 AND id > $1 AND {bulk_match("", 5)}
   ORDER BY id LIMIT $2)
  UNION ALL
  (SELECT id FROM jobs
   WHERE $6::text IS NULL AND state = $4 AND id > $1 AND {bulk_match("", 5)}
   ORDER BY id LIMIT $2)
) AS candidates
ORDER BY id
LIMIT $2
"""

# Each batch statement answers one row: how many jobs it looked at (``seen``: fewer than $2, the
# last batch), the last id it looked at (the new cursor), how many it changed, and the time of its
# transaction. Changed jobs are re-tested against the states and the filter as they are locked
# (a claim, a cancel or a requeue committed meanwhile is seen: such a job is left alone), in id
# order as every statement locking several jobs takes them. Each changed job gets a history step
# by 'dispatcher' (consumer: $14, the node) with the detail $15 naming the action.
_BULK_ANSWER: Final = """
SELECT (SELECT count(*) FROM picked) AS seen,
       (SELECT id FROM picked ORDER BY id DESC LIMIT 1) AS last,
       (SELECT count(*) FROM changed) AS changed, now() AS at
"""

# The picked jobs still in the states and matching the filter, locked in id order (re-tested as
# they are locked: a claim, a cancel or a requeue committed meanwhile is seen).
_BULK_LOCKED: Final = f"""locked AS (
    SELECT j.id, j.dispatched_at FROM jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM picked)) AND j.state IN ($3, $4)
      AND {bulk_match("j.", 5)}
    ORDER BY j.id
    FOR UPDATE
)"""

# Cancel: as CANCEL_JOB (the 0006 trigger cancels the jobs waiting for them in turn).
# $1-$13 as _BULK_PICK, $14 node id, $15 detail.
BULK_CANCEL: Final = f"""
WITH picked AS ({_BULK_PICK}),
{_BULK_LOCKED},
changed AS (
    UPDATE jobs j SET state = 'cancelled', lease_until = NULL, updated_at = now()
    FROM locked WHERE j.id = locked.id
    RETURNING j.id
), noted AS (
    INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group, consumer, at,
                            detail)
    SELECT gen_random_uuid(), id, 'cancelled', 0, 'dispatcher', $14, now(), $15 FROM changed
)
{_BULK_ANSWER}
"""

# Reschedule: as RESCHEDULE_JOB, to $16 (or each job's run_at moved by $17 seconds, never before
# 1970, where the scans of overdue jobs begin). A due notice for each job whose new time falls
# within $18 seconds from now (inside the window a node may have loaded already); a later one is
# loaded when its time comes near, and the entry a node holds at the old time claims nothing.
# $1-$13 as _BULK_PICK, $14 node id, $15 detail (' to <new time>' is added).
BULK_RESCHEDULE: Final = f"""
WITH picked AS ({_BULK_PICK}),
{_BULK_LOCKED},
changed AS (
    UPDATE jobs j
    SET run_at = coalesce($16::timestamptz, greatest(j.run_at + make_interval(secs => $17),
                                                     'epoch'::timestamptz)),
        updated_at = now()
    FROM locked WHERE j.id = locked.id
    RETURNING j.id, j.shard, j.run_at, j.routing_key
), noted AS (
    INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group, consumer, at,
                            detail)
    SELECT gen_random_uuid(), id, 'rescheduled', 0, 'dispatcher', $14, now(),
           $15 || ' to ' || to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
    FROM changed
)
SELECT (SELECT count(*) FROM picked) AS seen,
       (SELECT id FROM picked ORDER BY id DESC LIMIT 1) AS last,
       (SELECT count(*) FROM changed) AS changed, now() AS at,
       (SELECT count(dispatcher_notify_due_v1(id, shard, run_at, routing_key)) FROM changed
        WHERE run_at <= now() + make_interval(secs => $18)) AS notified
"""

# Requeue: as REQUEUE_DEAD_JOB (a new dispatch round, due now; the history keeps the dispatch
# replaced), each job moved to one of the shards $16 this node owns unless on one already, so
# that this node's loader walks them with a catch-up cursor (``Loader.catch_up``) at the
# catch-up pace beside the jobs falling due: no due notice per job. ($16 empty: shards kept.)
# $1-$13 as _BULK_PICK, $14 node id, $15 detail.
BULK_REQUEUE: Final = f"""
WITH picked AS ({_BULK_PICK}),
{_BULK_LOCKED},
changed AS (
    UPDATE jobs j
    SET state = 'scheduled', run_at = now(),
        shard = CASE WHEN cardinality($16::int[]) = 0 OR j.shard = ANY ($16::int[]) THEN j.shard
                     ELSE ($16::int[])[1 + get_byte(uuid_send(j.id), 15) % cardinality($16)]
                END,
        last_error = NULL, dispatched_at = NULL, lease_until = NULL, claimed_by = NULL,
        dispatch_round = gen_random_uuid(), updated_at = now()
    FROM locked WHERE j.id = locked.id
    RETURNING j.id
), noted AS (
    INSERT INTO job_events (event_id, job_id, outcome, attempt, consumer_group, consumer, at,
                            detail)
    SELECT gen_random_uuid(), id, 'dispatched', 0, 'dispatcher', $14, dispatched_at, NULL
    FROM locked WHERE dispatched_at IS NOT NULL
    UNION ALL
    SELECT gen_random_uuid(), id, 'requeued', 0, 'dispatcher', $14, now(), $15 FROM locked
)
{_BULK_ANSWER}
"""

# A dry run: how many jobs match now, up to $12 (a count past it stops: "at least"), and the
# first $2 of them in id order (whole rows). BULK_COUNT: $1, $2 states, $3-$11 as bulk_match,
# $12 the most it counts. BULK_SAMPLE: $1 the zero id, $2 sample size, $3-$13 as _BULK_PICK.
BULK_COUNT: Final = f"""
SELECT count(*) AS matched FROM (
    SELECT FROM jobs WHERE state IN ($1, $2) AND {bulk_match("", 3)} LIMIT $12
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
