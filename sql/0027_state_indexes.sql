-- 0027: jobs_state and jobs_finished go (docs/development/job-storage.md, step 2). Every insert
-- and every update of a job that is not HOT (all of them, while jobs_due's predicate names
-- state) wrote an entry in each: about six a job. What read them reads instead:
-- - a page, a count or a bulk batch of waiting, dead, cancelled or expired jobs: jobs_rest;
-- - of scheduled jobs: jobs_due (a page in due order), or the primary key (a bulk batch);
-- - of dispatching jobs: jobs_lease_until (lease_until is set exactly while a job is dispatching);
-- - of dispatched or succeeded jobs, the bulk of the table: the primary key, the state tested on
--   each row;
-- - retention: the primary key from a cursor, up to the first job created within the retention.
-- Dropping an index takes the table's lock for a moment only.

DROP INDEX jobs_state;
DROP INDEX jobs_finished;
