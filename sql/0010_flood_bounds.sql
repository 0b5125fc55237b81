-- 0010: recurring schedules and dependencies cannot flood (or stop) the dispatcher.
--
-- schedules.error: why the materialiser paused a schedule it could not plan or whose jobs could
-- not be stored (a zone gone from the tz database, a value stored before the API bounded it).
-- Such a schedule was retried every pass, or failed the pass and stopped the node; now it is
-- parked: paused with its reason, which the API shows and a resume clears.
ALTER TABLE schedules ADD COLUMN error text;
