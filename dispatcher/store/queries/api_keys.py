"""API keys."""

from typing import Final

# $1 token SHA-256, $2 name, $3 scope, $4 namespace or NULL, $5 routing-key prefixes. Tells every
# node on the channel 'dispatcher_keys' (delivered on commit): the first key closes the API at once.
INSERT_API_KEY: Final = """
WITH created AS (
    INSERT INTO api_keys (token_sha256, name, scope, namespace, routing_key_prefixes)
    VALUES ($1, $2, $3, $4, $5::text[])
    RETURNING id, name, scope, namespace, routing_key_prefixes, created_at, revoked_at
)
SELECT *, pg_notify('dispatcher_keys', 'created,' || id) FROM created
"""

# The live key with this token hash, if any. $1 token SHA-256.
SELECT_API_KEY: Final = """
SELECT id, name, scope, namespace, routing_key_prefixes, created_at, revoked_at
FROM api_keys WHERE token_sha256 = $1 AND revoked_at IS NULL
"""

# Every key, revoked ones too, without their hashes. No arguments.
LIST_API_KEYS: Final = """
SELECT id, name, scope, namespace, routing_key_prefixes, created_at, revoked_at
FROM api_keys ORDER BY id
"""

# $1 key id. Returns nothing when there is no such live key. Tells every node (a key notice, as
# for a creation) so that it is refused at once.
REVOKE_API_KEY: Final = """
WITH revoked AS (
    UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL RETURNING id
)
SELECT id, pg_notify('dispatcher_keys', 'revoked,' || id) FROM revoked
"""

# Whether a key was ever created (auth is on from then on). No arguments.
ANY_API_KEY: Final = "SELECT EXISTS (SELECT 1 FROM api_keys)"

# Every live key with its token hash: what a node holds in memory to answer any token without a
# query (``keyring``). No arguments.
LIVE_API_KEYS: Final = """
SELECT token_sha256, id, name, scope, namespace, routing_key_prefixes, created_at, revoked_at
FROM api_keys WHERE revoked_at IS NULL
"""
