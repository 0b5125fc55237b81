-- 0002: one row per logical shard with its epoch. A node that takes a shard bumps the epoch, and every
-- claim checks the epoch under a share lock, so a node that lost a shard (paused, partitioned,
-- restarted) can no longer claim its jobs, even in the instant after it wakes.
CREATE TABLE shard_epochs (
    shard      integer     PRIMARY KEY,
    epoch      bigint      NOT NULL DEFAULT 0,
    owner      text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
