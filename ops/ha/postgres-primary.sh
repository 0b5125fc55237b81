#!/usr/bin/env bash
# compose.ha.yaml's primary: run once by the image's entrypoint (docker-entrypoint-initdb.d), on
# the temporary server that initialises an empty data folder.
#
# The synchronous settings go to postgresql.auto.conf with ALTER SYSTEM, not on the command line:
# the temporary server gets the command line too, and its commits (POSTGRES_DB, the role below)
# would wait for a standby that cannot exist yet. The real server starts with them.
set -euo pipefail
: "${SYNCHRONOUS_STANDBY_NAMES:?set it to the application_name of the standby}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    --set standby="$SYNCHRONOUS_STANDBY_NAMES" <<'SQL'
CREATE ROLE replicator WITH LOGIN REPLICATION;
ALTER SYSTEM SET synchronous_standby_names = :'standby';
ALTER SYSTEM SET synchronous_commit = 'on';
SQL

# "all" in pg_hba.conf never matches a replication connection: it needs a line of its own.
# trust, as in compose.yaml: for trying it out; on real hosts scram-sha-256 and a password.
echo "host replication replicator all trust" >> "$PGDATA/pg_hba.conf"
