-- 0015: the expired-lease sweep reads only the leases that ran out since its last complete look
-- (a lower bound on lease_until), so that while a snapshot is held its cost stays what the last
-- few seconds left behind instead of a dead entry for every job fired since the snapshot began.
-- The index is keyed on lease_until alone, non-null exactly while a job is dispatching (every
-- move out of 'dispatching' clears it), so that the sweep tests the state row by row and no
-- other index (jobs_state's 'dispatching' range) matches it. It replaces jobs_leased. Built in
-- the migration's transaction: inserts wait for it (seconds per million jobs; see README
-- "Upgrading").
CREATE INDEX jobs_lease_until ON jobs (lease_until) INCLUDE (shard, run_at)
    WHERE lease_until IS NOT NULL;
DROP INDEX jobs_leased;
