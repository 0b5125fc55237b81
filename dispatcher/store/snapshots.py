"""What holds vacuum back: the oldest snapshots PostgreSQL keeps dead rows for."""

from __future__ import annotations

from dispatcher.store.db import Database
from dispatcher.store.queries import snapshots as queries
from dispatcher.upkeep.vacuum_horizon import Holder, Look

# A look at the catalogs, on a pooled connection: short, or it is skipped until the next.
LOOK_TIMEOUT_S = 5.0


class SnapshotStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def look(self, limit: int) -> Look:
        async with self._db.connection(LOOK_TIMEOUT_S) as connection:
            rows = await connection.fetch(queries.OLDEST_SNAPSHOTS, limit)
            sees_all = await connection.fetchval(queries.SEES_ALL_SESSIONS)
        holders = [
            Holder(
                kind=row["kind"],
                name=row["holder"],
                xmin=row["xmin"],
                xmin_age=row["xmin_age"],
                held_s=row["held_s"],
            )
            for row in rows
        ]
        return Look(holders=holders, sees_all_sessions=bool(sees_all))
