-- 0028: an outcome settles a job still dispatching (RECORD_EVENTS), instead of waiting in
-- jobs.reported for the confirm's mark to move it there: nothing writes reported or
-- reported_error any more (the columns go with the claims, docs/development/job-storage.md
-- step 3). The jobs an earlier release left with an outcome waiting for its mark are settled here,
-- as that mark would have.

UPDATE jobs
SET state = reported, last_error = reported_error, dispatched_at = coalesce(dispatched_at, now()),
    lease_until = NULL, updated_at = now(), reported = NULL, reported_error = NULL
WHERE reported IS NOT NULL;
