"""Shards and their epochs."""

from typing import Final

# Create the epoch rows on first start. $1 shard count.
ENSURE_SHARDS: Final = """
INSERT INTO shard_epochs (shard) SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING
"""

COUNT_SHARDS: Final = "SELECT count(*) FROM shard_epochs"

# Take shards: a new epoch fences every claim made under the old one. $1 shards, $2 node id.
BUMP_EPOCHS: Final = """
UPDATE shard_epochs SET epoch = epoch + 1, owner = $2, updated_at = now()
WHERE shard = ANY($1::int[])
RETURNING shard, epoch
"""

# Current epochs (for status pages). No arguments.
SELECT_EPOCHS: Final = "SELECT shard, epoch, owner FROM shard_epochs ORDER BY shard"
