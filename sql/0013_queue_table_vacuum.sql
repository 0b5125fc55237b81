-- 0013: jobs and job_events are queue tables: every job is inserted, claimed, marked dispatched
-- and finished within seconds, and deleted after the retention. PostgreSQL's default vacuums a
-- table once a tenth of it changed: with millions of finished jobs kept, the partial indexes
-- the claims and confirms read (jobs_leased, jobs_due) filled with dead entries for hours between
-- two runs, and the planner worked from statistics of another mix of states. Vacuumed and
-- analysed after 2% of the table changed instead (and after 1 000 rows when it is small).
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);
ALTER TABLE job_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);
