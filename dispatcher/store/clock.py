"""PostgreSQL's clock, sampled over one round trip (``timesource.Sample``)."""

from __future__ import annotations

from dispatcher.store.db import Database
from dispatcher.store.queries import clock as queries
from dispatcher.timing.kinds import Mono, Wall
from dispatcher.timing.timesource import Sample

# A sample waits for a pooled connection, then reads the clock: only the read is timed.
SAMPLE_TIMEOUT_S = 2.0


class ClockStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def sample(self, *, mono: Mono, wall: Wall) -> Sample:
        """One round trip timed by MONO, with WALL read at its midpoint (estimated)."""
        async with self._db.connection(SAMPLE_TIMEOUT_S) as connection:
            sent = mono()
            db = await connection.fetchval(queries.READ_CLOCK)
            received = mono()
            wall_now = wall()
        midpoint_wall = wall_now - (received - sent) / 2
        return Sample(sent=sent, received=received, db=float(db), wall=midpoint_wall)
