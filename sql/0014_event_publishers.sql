-- 0014: consumer events tied to the broker user that published them, ordered by receipt, and
-- ignored events bounded per job.
--
-- job_events.ignored takes two more reasons, given only while DISPATCHER_EVENT_USERS is set:
-- no_user (the message carried no AMQP user_id) and publisher (its user may not report on the
-- job's namespace or routing key).
ALTER TABLE job_events DROP CONSTRAINT job_events_ignored_known;
ALTER TABLE job_events ADD CONSTRAINT job_events_ignored_known
    CHECK (ignored IN ('other_round', 'no_round', 'routing_key', 'no_user', 'publisher'))
    NOT VALID;

-- job_events.received: the order the dispatcher recorded the events in (a batch's in its
-- delivery order), which decides the final outcome of a round instead of the consumer's own
-- "at" (a consumer could date an event ahead to win). NULL for events recorded before this
-- migration: they come before every later one. No default: adding the column rewrites nothing.
CREATE SEQUENCE job_events_received AS bigint;
ALTER TABLE job_events ADD COLUMN received bigint;

-- jobs.ignored_dropped: ignored events of the job that were counted but not kept (a few are kept
-- for its history); a constant default, so adding it rewrites nothing.
ALTER TABLE jobs ADD COLUMN ignored_dropped bigint NOT NULL DEFAULT 0;
