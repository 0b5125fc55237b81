"""Jobs claimed by hand, as a node's claim leaves them (sql/0030): for the tests that stand in
for another node, a dead one or an earlier process."""

from __future__ import annotations

from typing import Final

# The jobs' rows dispatching under the node, epoch and lease, and the claim's own row.
# $1 ids, $2 node, $3 lease seconds from now (negative: run out), $4 epoch (NULL: the row's),
# $5 shard (NULL: the row's).
CLAIM_BY_HAND: Final = """
WITH claimed AS (
    UPDATE jobs
    SET state = 'dispatching', claimed_by = $2, claim_epoch = coalesce($4::bigint, claim_epoch),
        shard = coalesce($5::int, shard), lease_until = now() + make_interval(secs => $3),
        publish_attempts = publish_attempts + 1
    WHERE id = ANY($1::uuid[])
    RETURNING id, shard, claim_epoch, lease_until
)
INSERT INTO claims (node, lease_until, ids, shards, epochs)
SELECT $2, max(lease_until), array_agg(id), array_agg(shard), array_agg(coalesce(claim_epoch, 0))
FROM claimed
HAVING count(*) > 0
"""
