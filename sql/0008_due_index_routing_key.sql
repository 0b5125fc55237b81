-- (There is no 0007: two branches reserved numbers while they were written and the one holding
-- 0007 landed under another number. Gaps are harmless; a migration applied out of order is not,
-- which is why nodes check that the applied ones are a prefix of those they ship.)
-- 0008: the loader reads each due job's routing key (firing takes turns between routing keys, so
-- one key's burst cannot hold up the others). Carrying it in the due index keeps the load an
-- index scan of that index alone. Built in the migration's transaction: inserts wait for it
-- (seconds per million scheduled jobs; see README "Upgrading").
CREATE INDEX jobs_due_keyed ON jobs (run_at, id) INCLUDE (shard, routing_key)
    WHERE state = 'scheduled';
DROP INDEX jobs_due;
ALTER INDEX jobs_due_keyed RENAME TO jobs_due;
