#!/usr/bin/env bash
# compose.ha.yaml's primary: run once by the image's entrypoint (docker-entrypoint-initdb.d), on
# the temporary server that initialises an empty data folder.
#
# The synchronous settings go to postgresql.auto.conf with ALTER SYSTEM, not on the command line:
# the temporary server gets the command line too, and its commits (POSTGRES_DB, the role below)
# would wait for a standby that cannot exist yet. The real server starts with them.
set -euo pipefail
: "${SYNCHRONOUS_STANDBY_NAMES:?set it to the application_name of the standby}"
: "${REPLICATION_PASSWORD:?set it to the password of the replicator role the standby uses}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    --set standby="$SYNCHRONOUS_STANDBY_NAMES" --set password="$REPLICATION_PASSWORD" <<'SQL'
CREATE ROLE replicator WITH LOGIN REPLICATION PASSWORD :'password';
ALTER SYSTEM SET synchronous_standby_names = :'standby';
ALTER SYSTEM SET synchronous_commit = 'on';
SQL

# "all" in pg_hba.conf never matches a replication connection: it needs a line of its own.
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
