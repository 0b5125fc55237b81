#!/usr/bin/env bash
# compose.ha.yaml's standby: its entrypoint. On first start (an empty data folder) it copies the
# primary with pg_basebackup -R (standby.signal and primary_conninfo), then hands over to the
# image's own entrypoint, which finds the data folder made and starts the server as a standby.
set -euo pipefail
: "${PRIMARY_HOST:?set it to the host name of the primary}"
: "${STANDBY_APPLICATION_NAME:?set it to the name in synchronous_standby_names of the primary}"
: "${REPLICATION_PASSWORD:?set it to the password of the replicator role of the primary}"

# The password goes into primary_conninfo, as the walreceiver needs it: URL-safe characters only.
conninfo="host=$PRIMARY_HOST user=replicator password=$REPLICATION_PASSWORD"
conninfo="$conninfo application_name=$STANDBY_APPLICATION_NAME"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA"
    chmod 0700 "$PGDATA"
    # The primary may still be initialising: pg_basebackup empties the folder when it fails.
    until pg_basebackup --pgdata="$PGDATA" --dbname="$conninfo" --write-recovery-conf \
        --wal-method=stream --checkpoint=fast; do
        echo "waiting for the primary at $PRIMARY_HOST" >&2
        sleep 2
    done
    # The copy carries the primary's postgresql.auto.conf. Its application_name is the one the
    # primary waits for, whatever -R wrote; and, promoted, it has no standby to wait for.
    cat >> "$PGDATA/postgresql.auto.conf" <<CONF
primary_conninfo = '$conninfo'
synchronous_standby_names = ''
CONF
fi
exec docker-entrypoint.sh "$@"
