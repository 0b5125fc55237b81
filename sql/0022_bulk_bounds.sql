-- 0022: bulk actions shared fairly by many tenants (dispatcher/bulk.py, "Bounds").
--
-- by_operator: made with an admin key. An operator's actions are worked first and counted in a
-- budget of their own, so no tenant's actions hold them up or use up their room. The actions for
-- every namespace (namespace NULL) stored before were an admin's.
-- turn_at: when a batch of the action last ran; runners give the next batch to the namespace
-- whose last batch is the oldest, then to its least recently worked action.
ALTER TABLE bulk_actions ADD COLUMN by_operator boolean NOT NULL DEFAULT false;
UPDATE bulk_actions SET by_operator = true WHERE namespace IS NULL;
ALTER TABLE bulk_actions ADD COLUMN turn_at timestamptz;

-- What a new action's budget counts, and what the removal of old ones looks for.
CREATE INDEX bulk_actions_budget ON bulk_actions ((coalesce(namespace, '*')), by_operator);
CREATE INDEX bulk_actions_ended ON bulk_actions (updated_at) WHERE status <> 'running';
