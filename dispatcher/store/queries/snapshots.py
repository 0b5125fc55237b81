"""What holds vacuum back (``vacuum_watch``)."""

from typing import Final

# The oldest snapshots that keep vacuum from removing dead rows, oldest xmin first: sessions (a
# report's open transaction, a pg_dump, a standby's feedback through its walsender), prepared
# transactions, and replication slots (an idle logical consumer). held_s: how long PostgreSQL
# says each has been held (unknown for a slot, and for other roles' sessions unless this role has
# pg_read_all_stats, as pg_monitor gives: SEES_ALL_SESSIONS says whether it does). A session of
# another database, or a transaction prepared there, holds back only that database's tables: it
# is left out. A walsender's (a standby's feedback) belongs to no database and holds back every
# one. $1 limit.
OLDEST_SNAPSHOTS: Final = """
SELECT kind, holder, xmin, xmin_age, held_s FROM (
    SELECT 'session' AS kind,
           format('pid %s (%s%s)', pid, coalesce(nullif(application_name, ''), backend_type),
                  coalesce(', ' || state, '')) AS holder,
           backend_xmin::text AS xmin, age(backend_xmin) AS xmin_age,
           extract(epoch FROM now() - coalesce(xact_start, query_start))::float8 AS held_s
    FROM pg_stat_activity
    WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
      AND (datname IS NULL OR datname = current_database())
    UNION ALL
    SELECT 'prepared transaction', gid, transaction::text, age(transaction),
           extract(epoch FROM now() - prepared)::float8
    FROM pg_prepared_xacts
    WHERE database = current_database()
    UNION ALL
    SELECT 'replication slot', slot_name::text, xmin::text, age(xmin), NULL
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL
) AS holders
ORDER BY xmin_age DESC
LIMIT $1
"""

SEES_ALL_SESSIONS: Final = "SELECT pg_has_role('pg_read_all_stats', 'USAGE')"
