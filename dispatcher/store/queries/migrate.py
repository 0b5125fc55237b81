"""Migrations: the lock and the record of what was applied."""

from typing import Final

MIGRATION_LOCK: Final = "SELECT pg_advisory_lock(hashtext('dispatcher.migrations'))"

MIGRATION_UNLOCK: Final = "SELECT pg_advisory_unlock(hashtext('dispatcher.migrations'))"

CREATE_MIGRATIONS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text        PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text
"""

# Versions with the sha256 of the file applied (NULL: applied by a release that recorded none).
# Read through to_jsonb so that it also reads the table of such a release, which has no checksum
# column yet (a status check changes nothing).
APPLIED_MIGRATIONS: Final = """
SELECT m.version, to_jsonb(m) ->> 'checksum' AS checksum, m.applied_at FROM schema_migrations m
"""

# Whether anything was ever migrated here (the status check reads, never creates, the table).
MIGRATIONS_TABLE_EXISTS: Final = "SELECT to_regclass('schema_migrations') IS NOT NULL"

# $1 version, $2 checksum.
RECORD_MIGRATION: Final = "INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2)"

# Adopt the shipped files' checksums for versions recorded without one, in one statement.
# $1 versions, $2 their checksums (parallel arrays).
ADOPT_MIGRATION_CHECKSUMS: Final = """
UPDATE schema_migrations m SET checksum = shipped.checksum
FROM unnest($1::text[], $2::text[]) AS shipped(version, checksum)
WHERE m.version = shipped.version AND m.checksum IS NULL
"""
