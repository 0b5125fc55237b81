-- 0011: consumer events are tied to the dispatch they report on.
--
-- Any consumer could publish an event about any job, and an event of an earlier dispatch (before
-- an admin requeue) changed the new one. Each dispatch of a job now has a round: a random id the
-- publisher sends as the AMQP header x-dispatcher-round and the SDK echoes in each event. An
-- event of another round, without one when the job has one, or naming another routing key than
-- the job's is kept in the history with the reason it was ignored, and changes nothing.
--
-- jobs.dispatch_round: new rows get one; rows stored before this migration get theirs when they
-- are claimed (CLAIM_JOBS), so adding the column rewrites nothing. A requeue renews it. A job
-- dispatched before the migration has none, and keeps accepting events without one (the SDK of
-- its consumers may not echo rounds yet).
ALTER TABLE jobs ADD COLUMN dispatch_round uuid;
ALTER TABLE jobs ALTER COLUMN dispatch_round SET DEFAULT gen_random_uuid();

-- job_events.round: the round the event names (NULL: none); job_events.ignored: NULL when the
-- event counted, else why not.
ALTER TABLE job_events ADD COLUMN round uuid;
ALTER TABLE job_events ADD COLUMN ignored text;
ALTER TABLE job_events ADD CONSTRAINT job_events_ignored_known
    CHECK (ignored IN ('other_round', 'no_round', 'routing_key')) NOT VALID;
