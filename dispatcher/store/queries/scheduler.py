"""The scheduler's statements: loading due jobs, claiming them fenced by epoch, marking them
dispatched, and the sweeps that find what no load will."""

import dataclasses
from typing import Final

from dispatcher import models
from dispatcher.store.queries.shared import (
    ASYNC_COMMIT,
    IN_FLIGHT,
    in_flight_under,
    not_held,
    note_events,
)

# Park jobs that nothing can publish (firing gave up on them, see ``firing/quarantine.py``):
# dead with the reason, which their history shows as the dispatcher's verdict; the jobs waiting
# for them are cancelled by the 0006 trigger, as for any dead job. $1 ids, $2 reasons (same
# order), $3 node id. Returns the jobs parked.
PARK_JOBS: Final = f"""
WITH parked AS (
    UPDATE jobs j
    SET state = 'dead', last_error = p.reason, lease_until = NULL, updated_at = now()
    FROM unnest($1::uuid[], $2::text[]) AS p(id, reason)
    WHERE j.id = p.id AND j.state IN ('scheduled', 'dispatching')
    RETURNING j.id, j.routing_key, j.publish_attempts, p.reason
), noted AS (
    {
    note_events(
        "parked",
        job_id="id",
        outcome="'dead'::text",
        attempt="publish_attempts",
        consumer="$3::text",
        error="reason",
    )
}
)
SELECT id, routing_key FROM parked
"""

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

# Claimed jobs whose publish was never confirmed (crash, outage), their leases run out since $3
# (PostgreSQL's clock; the beginning of time for a full look), in the order they ran out, after
# the time of the look (one row at least: the time alone when none did).
# They are found through their claims' rows (claims_lease_until, a row a claim), in the range of
# lease ends since $3 only: that range is what bounds the look while a snapshot is held, when the
# index keeps a dead entry for every claim made since. Each claim's jobs are looked up by the
# primary key and kept while still in flight under it (``in_flight_under``).
# $1 shards, $2 limit, $3 the lower bound.
EXPIRED_LEASES: Final = f"""
SELECT now() AS looked_at, expired.id, expired.shard, expired.run_at, expired.routing_key,
       expired.priority
FROM (VALUES (1)) AS one(n)
LEFT JOIN LATERAL (
    SELECT j.id, j.shard, j.run_at, j.routing_key, j.priority, c.lease_until
    FROM claims c
    CROSS JOIN LATERAL unnest(c.ids) AS claimed(id)
    JOIN jobs j ON j.id = claimed.id
    WHERE c.lease_until >= $3 AND c.lease_until < now() AND {in_flight_under("j", "c")}
      AND j.shard = ANY($1::int[])
    ORDER BY c.lease_until
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
# Found through the claims' rows (a few seconds' worth: housekeeping deletes those with nothing
# in flight), each job's epoch read from its claim before its row is looked up.
# $1 shards held, $2 their epochs, $3 the first epoch this process took each under (same order),
# $4 this node's id, $5 the other nodes in the cluster, $6 seconds, $7 limit.
ORPHANED_CLAIMS: Final = f"""
SELECT j.id, j.shard, j.run_at, j.routing_key, j.priority,
       CASE WHEN CASE WHEN j.claimed_by = $4 THEN j.claim_epoch >= held.first_epoch
                      ELSE j.claimed_by = ANY($5::text[]) END
            THEN greatest(0, extract(epoch FROM j.lease_until - now()) - $6)::float8
            ELSE 0::float8
       END AS ripe_in_s
FROM claims c
CROSS JOIN LATERAL unnest(c.ids, c.shards, c.epochs) AS claimed(id, shard, epoch)
JOIN unnest($1::int[], $2::bigint[], $3::bigint[]) AS held(shard, epoch, first_epoch)
  ON claimed.shard = held.shard AND claimed.epoch < held.epoch
JOIN jobs j ON j.id = claimed.id
WHERE {in_flight_under("j", "c")} AND j.claim_epoch < held.epoch
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

# Claim due jobs for publishing, fenced (``dispatcher_claim_v1``, sql/0029): a row is claimed only
# while the shard's epoch is the one this node holds, and the epoch rows are share-locked, in a
# statement before the one that reads the jobs, so that a concurrent takeover (which bumps them)
# or a change of the shard's pending jobs (a cancel, a reschedule, a bulk batch, a replace: each
# takes them FOR NO KEY UPDATE first) waits for this claim to commit or happens entirely before
# it, and is then seen.
# Each id comes with the run_at its heap entry was made for: a job rescheduled later since then is
# not claimed by the stale entry (the entry of the new time claims it).
# The plan looks each id up by the primary key whatever the table's statistics: the fence is one
# array, never a relation joined (as one, the planner looped over it, repeating the lookups once
# per shard: 128k index scans for 500 jobs). The state test is a CASE, not an OR of states,
# which would match a partial index instead.
# The clock fence: a job is claimed only once PostgreSQL's own clock, read once at the start (the
# first column), is within $7 seconds of its run_at: a node whose idea of the time is ahead cannot
# talk it round. The second column reads the clock again as the answer is made: a claimed job is
# published no earlier than its run_at by that reading. One row at least, the clocks alone, when
# nothing was claimed.
# $1 ids, $2 shards held (those of the ids), $3 their epochs (same order), $4 node id, $5 lease
# seconds, $6 the entries' run_at (POSIX seconds, same order as $1), $7 the fence's tolerance
# (seconds), $8-$9 what flow rules hold (``not_held``'s two parameters): a scheduled job held
# since its entry was loaded is skipped (and loaded again when released), unless it is one of
# $10, the ids a flow rule's meter let go; a claim run out is re-fired regardless (it was
# dispatched once already).
# Each row: the two clocks, then CLAIMED_COLUMNS.
CLAIM_JOBS: Final = """
SELECT * FROM dispatcher_claim_v1($1::uuid[], $2::int[], $3::bigint[], $4::text, $5::float8,
                                  $6::float8[], $7::float8, $8::jsonb, $9::text[], $10::uuid[])
"""

# RabbitMQ confirmed these: dispatched. A job its consumer settled already (RECORD_EVENTS settles
# a job still dispatching) is no longer in flight, and is left as it is; a recording of its
# events that writes the row meanwhile is waited for and read.
# Committed without waiting for the WAL to reach the disk (``ASYNC_COMMIT``): a mark lost in a
# crash of PostgreSQL leaves the job dispatching, and it fires again once its lease runs out.
# $1 ids.
MARK_DISPATCHED: Final = f"""
WITH {ASYNC_COMMIT}
UPDATE jobs
SET state = 'dispatched', dispatched_at = now(), lease_until = NULL, updated_at = now()
WHERE id = ANY($1::uuid[]) AND {IN_FLIGHT} AND (SELECT committed FROM async_commit)
"""

# Their ttl ran out before they could be published. $1 ids.
MARK_EXPIRED: Final = f"""
UPDATE jobs SET state = 'expired', lease_until = NULL, updated_at = now()
WHERE id = ANY($1::uuid[]) AND {IN_FLIGHT}
"""

# The publish failed: give the claims back so they fire again. $1 ids, $2 node id.
RELEASE_CLAIMS: Final = f"""
UPDATE jobs SET state = 'scheduled', lease_until = NULL, claimed_by = NULL, updated_at = now()
WHERE id = ANY($1::uuid[]) AND {IN_FLIGHT} AND claimed_by = $2
"""

# The same for claims of shards this node lost meanwhile: the new owner may have loaded past them
# already, so each is announced to it by a due notice (see ``store/due_notices.py``).
# $1 ids, $2 node id.
RELEASE_CLAIMS_ANNOUNCED: Final = f"""
WITH released AS (
    UPDATE jobs SET state = 'scheduled', lease_until = NULL, claimed_by = NULL, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND {IN_FLIGHT} AND claimed_by = $2
    RETURNING id, shard, run_at, routing_key
)
SELECT count(dispatcher_notify_due_v1(id, shard, run_at, routing_key)) FROM released
"""
