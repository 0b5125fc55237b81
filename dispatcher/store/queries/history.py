"""Consumers' events and a job's history; retention and the counts by state."""

from typing import Final

from dispatcher.store.queries.shared import events_of, in_flight_under, note_rows

# Record consumers' events, only for jobs that exist here, as one event batch in the order
# received, and move each job to the final state its last final event names, last in that order
# (never the consumer's own "at": it could date one ahead to win). Events arrive at-least-once: a
# redelivered one is stored again (a job's history reads each event id once; moving a job to the
# outcome it has changes nothing). An event is ignored (changing nothing) when, with grants given
# ($12..$14: DISPATCHER_EVENT_USERS), its message had no user_id (no_user) or its user holds no
# grant covering the job's namespace and routing key (publisher); when it names another dispatch
# round than the job's (other_round), none while the job has one (no_round: jobs dispatched
# before migration 0011 have none and take events without), or another routing key
# (routing_key). The first $15 ignored events of a job are kept in its history
# (jobs.ignored_kept counts them); the others are only counted (jobs.ignored_dropped), so that a
# flood of forgeries cannot grow a job's history without bound.
#
# A job is moved only from 'scheduled', 'dispatching', 'dispatched' or a final state, by the
# update alone: it locks the rows it changes, and a row changed since the statement's snapshot is
# judged again by its latest version (its state and round). An event of the job's round proves
# the message went out (the round is only in it, and a requeue makes a new one), whatever the
# row says: a job still 'dispatching' (its confirm not marked yet) is settled, and the confirm's
# mark then finds nothing in flight to change; so is a job 'scheduled' again because its publish
# looked failed (no confirm in time: released) though the message reached the queue, which then
# does not fire a second time (a job stored before rounds, 0011, and never claimed has none: no
# event settles it while it is scheduled). Returns the events recorded or counted, and whether
# each was ignored, for the metrics.
# $1 event ids, $2 job ids, $3 outcomes, $4 attempts, $5 groups, $6 consumers, $7 errors, $8 times,
# $9 routing keys, $10 rounds (NULL: none), $11 publishers (the messages' user_id, NULL: none),
# $12 grant users, $13 grant namespaces (NULL: any), $14 grant prefixes (NULL: any), $15 ignored
# events kept per job.
RECORD_EVENTS: Final = f"""
WITH batch AS (
    -- The first of each event id the batch repeats.
    SELECT DISTINCT ON (event_id) *
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[], $5::text[], $6::text[],
                $7::text[], $8::timestamptz[], $9::text[], $10::uuid[], $11::text[])
        WITH ORDINALITY
        AS e(event_id, job_id, outcome, attempt, consumer_group, consumer, error, at,
             routing_key, round, publisher, position)
    ORDER BY event_id, position
), grants AS (
    SELECT * FROM unnest($12::text[], $13::text[], $14::text[]) AS g(publisher, namespace, prefix)
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
           END AS ignored,
           j.state, j.ignored_kept
    FROM batch b JOIN jobs j ON j.id = b.job_id
), ranked AS (
    SELECT judged.*,
           ignored IS NULL
           OR row_number() OVER (PARTITION BY job_id, ignored IS NULL ORDER BY position)
              + ignored_kept <= $15 AS kept
    FROM judged
), noted AS (
    {note_rows("(SELECT * FROM ranked WHERE kept ORDER BY position) AS kept")}
), final AS (
    SELECT DISTINCT ON (job_id) job_id, outcome, error, round FROM ranked
    WHERE ignored IS NULL AND outcome IN ('succeeded', 'dead')
      AND state IN ('scheduled', 'dispatching', 'dispatched', 'succeeded', 'dead')
      AND (state <> 'scheduled' OR round IS NOT NULL)  -- one that went out has its round
    ORDER BY job_id, position DESC
), counted AS (
    SELECT job_id, count(*) FILTER (WHERE kept) AS kept, count(*) FILTER (WHERE NOT kept) AS dropped
    FROM ranked WHERE ignored IS NOT NULL GROUP BY job_id
), changes AS (
    -- One update a job (a statement cannot change a row twice): its outcome and its counts.
    SELECT coalesce(f.job_id, c.job_id) AS job_id, f.outcome, f.error, f.round,
           coalesce(c.kept, 0) AS kept, coalesce(c.dropped, 0) AS dropped
    FROM final f FULL JOIN counted c ON c.job_id = f.job_id
), moved AS (
    -- The state and round are tested here again: a row changed since the snapshot is judged by
    -- its latest version.
    UPDATE jobs j
    SET state = coalesce(c.outcome, j.state),
        last_error = CASE WHEN c.outcome IS NULL THEN j.last_error ELSE c.error END,
        lease_until = CASE WHEN c.outcome IS NULL THEN j.lease_until END,
        dispatched_at = CASE WHEN c.outcome IS NULL THEN j.dispatched_at
                             ELSE coalesce(j.dispatched_at, now()) END,
        updated_at = CASE WHEN c.outcome IS NULL THEN j.updated_at ELSE now() END,
        ignored_kept = j.ignored_kept + c.kept,
        ignored_dropped = j.ignored_dropped + c.dropped
    FROM changes c
    WHERE j.id = c.job_id
      AND (c.outcome IS NULL
           OR (j.state IN ('scheduled', 'dispatching', 'dispatched', 'succeeded', 'dead')
               AND (j.state <> 'scheduled' OR c.round IS NOT NULL)
               AND j.dispatch_round IS NOT DISTINCT FROM c.round))
)
SELECT event_id, ignored FROM ranked
"""

# A job's events in the order they happened (by their consumers' clocks), each with how many of
# the job's ignored events were only counted (the same on every row; with none kept, none were):
# the steps that frame the rounds (a requeue and the dispatch it replaced) and the $2 newest of
# the others (the consumers' events, and the dispatcher's changes to a pending job: a key
# replaced a thousand times shows its last changes), with how many others there are. An event
# stored twice (a redelivery: RECORD_EVENTS) is read once, the first stored. $1 job id, $2 the
# most of those shown.
SELECT_JOB_EVENTS: Final = f"""
SELECT outcome, attempt, consumer_group, consumer, error, at, ignored, detail, ignored_dropped,
       reported
FROM (
  SELECT e.*, (SELECT ignored_dropped FROM jobs WHERE id = $1) AS ignored_dropped,
         count(*) FILTER (WHERE outcome NOT IN ('dispatched', 'requeued')) OVER () AS reported,
         row_number() OVER (PARTITION BY outcome IN ('dispatched', 'requeued')
                            ORDER BY at DESC, attempt DESC) AS newest
  FROM (
      SELECT DISTINCT ON (event_id) * FROM ({events_of("$1::uuid")}) AS stored
      ORDER BY event_id, batch, position
  ) AS e
) AS history
WHERE outcome IN ('dispatched', 'requeued') OR newest <= $2
ORDER BY at, attempt, outcome <> 'started'
"""

# Delete the jobs finished longer ago than the retention among the $2 after id $3, walking the
# primary key up to the first job created within the retention (ids follow the time a job was
# made, and a job finishes after it is made: what follows cannot be old enough). The state and the
# time are tested on each row: no index names them, so that an update of either stays HOT.
# Locked rows are skipped (a requeue in flight), so no statement holds many locks for long; a job
# passed over is looked at again when the walk starts over. Their events go with their batches
# (DELETE_SPENT_BATCHES). Returns the last id looked at (NULL: none after $3 is old enough) and
# how many went. $1 retention seconds, $2 jobs, $3 the id to look after.
DELETE_FINISHED: Final = """
WITH next AS (
    SELECT id, created_at < now() - make_interval(secs => $1) AS old
    FROM jobs WHERE id > $3 ORDER BY id LIMIT $2
), looked AS (
    SELECT id FROM next
    WHERE id < coalesce((SELECT id FROM next WHERE NOT old ORDER BY id LIMIT 1),
                        'ffffffff-ffff-ffff-ffff-ffffffffffff')
), doomed AS (
    SELECT j.id FROM jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM looked))
      AND j.state IN ('dispatched', 'succeeded', 'dead', 'cancelled', 'expired')
      AND j.updated_at < now() - make_interval(secs => $1)
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM jobs j USING doomed WHERE j.id = doomed.id RETURNING j.id
)
SELECT (SELECT id FROM looked ORDER BY id DESC LIMIT 1) AS last,
       (SELECT count(*) FROM gone) AS deleted
"""

# Event batches recorded longer ago than the retention whose jobs are all gone; a batch naming a
# job still here is kept (a pending job's notes, a requeued job's earlier rounds). Looks at the
# $2 batches after id $3, up to the first recorded since the retention (ids follow the time
# recorded). Returns the last id looked at (NULL: none was old enough) and how many went.
# $1 retention seconds, $2 batches, $3 the id to look after.
DELETE_SPENT_BATCHES: Final = """
WITH next AS (
    SELECT id, job_ids, recorded_at < now() - make_interval(secs => $1) AS old
    FROM event_batches WHERE id > $3 ORDER BY id LIMIT $2
), looked AS (
    SELECT id, job_ids FROM next
    WHERE id < coalesce((SELECT min(id) FROM next WHERE NOT old), 'Infinity'::numeric)
), spent AS (
    DELETE FROM event_batches b USING looked l
    WHERE b.id = l.id AND NOT EXISTS (SELECT FROM jobs j WHERE j.id = ANY (l.job_ids))
    RETURNING b.id
)
SELECT (SELECT max(id) FROM looked) AS last, (SELECT count(*) FROM spent) AS deleted
"""

# Claims with nothing in flight under them any more (their jobs confirmed, released, expired,
# parked or claimed again), made more than $1 seconds ago: $2 at most, oldest first; rows another
# node is deleting are skipped. A claim is spent within a second or so of being made, unless its
# jobs wait for the sweep of run-out leases (or a new owner): those are passed over, at most a
# lease's worth. Returns how many went. $1 seconds, $2 claims.
DELETE_SPENT_CLAIMS: Final = f"""
WITH spent AS (
    SELECT c.id FROM claims c
    WHERE c.made_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (
          SELECT FROM unnest(c.ids) AS claimed(id)
          JOIN jobs j ON j.id = claimed.id
          WHERE {in_flight_under("j", "c")}
      )
    ORDER BY c.made_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM claims c USING spent WHERE c.id = spent.id RETURNING c.id
)
SELECT count(*) FROM gone
"""

# Job counts (see dispatcher/upkeep/housekeeping.py): one node at a time counts, under this lock,
# the states whose last count is old enough, and every node reads the result from job_counts.
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


def _count_of(states: str, rows: str) -> str:
    """Each of ``states`` (an array expression) its jobs per routing key, from ``rows`` (a query
    of the jobs' states and routing keys): the top $2 keys, most jobs first, and the rest summed;
    when the count started and how long it took (the columns SAVE_COUNT takes, in its order). A
    row for every state asked, one without jobs too."""
    return f"""
WITH counted AS (
    SELECT state, routing_key, count(*) AS jobs FROM ({rows}) AS of_states
    GROUP BY state, routing_key
), ranked AS (
    SELECT state, routing_key, jobs,
           row_number() OVER (PARTITION BY state ORDER BY jobs DESC, routing_key) AS rank
    FROM counted
)
SELECT s.state,
       coalesce(array_agg(r.routing_key ORDER BY r.rank) FILTER (WHERE r.rank <= $2), '{{}}')
           AS routing_keys,
       coalesce(array_agg(r.jobs ORDER BY r.rank) FILTER (WHERE r.rank <= $2), '{{}}') AS jobs,
       coalesce(sum(r.jobs) FILTER (WHERE r.rank > $2), 0)::bigint AS other_jobs,
       statement_timestamp() AS counted_at,
       extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS count_s
FROM unnest({states}) AS s(state)
LEFT JOIN ranked r ON r.state = s.state
GROUP BY s.state
ORDER BY s.state
"""


# A state an index holds, from its range of that index alone, never the other states' rows (one
# branch per state, as in LIST_JOBS): scheduled jobs from jobs_due, dispatching ones from the
# claims' rows (each job looked up by the primary key: ``in_flight_under``), waiting, dead,
# cancelled and expired ones from jobs_rest. $1 state (one of ``INDEXED_STATES``), $2 keys.
COUNT_STATE: Final = _count_of(
    "ARRAY[$1::text]",
    f"""
    SELECT $1::text AS state, routing_key FROM jobs WHERE $1 = 'scheduled' AND state = 'scheduled'
    UNION ALL
    SELECT $1::text, j.routing_key FROM claims c
    CROSS JOIN LATERAL unnest(c.ids) AS claimed(id)
    JOIN jobs j ON j.id = claimed.id
    WHERE $1 = 'dispatching' AND {in_flight_under("j", "c")}
    UNION ALL
    SELECT $1::text, routing_key FROM jobs
    WHERE $1 IN ('waiting', 'dead', 'cancelled', 'expired') AND rest = $1
""",
)
INDEXED_STATES: Final = frozenset(
    {"scheduled", "dispatching", "waiting", "dead", "cancelled", "expired"}
)

# Dispatched and succeeded jobs, the bulk of the table, which no index names (an update of their
# state stays HOT): the table read whole, once for all the states asked, which is why such a
# count is spaced out most (``upkeep/housekeeping.py``). $1 states (none of ``INDEXED_STATES``),
# $2 keys.
COUNT_UNINDEXED_STATES: Final = _count_of(
    "$1::text[]", "SELECT state, routing_key FROM jobs WHERE state = ANY($1::text[])"
)

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
