"""The node's time, measured against a real PostgreSQL's clock (``timing/timekeeper.py``).

The clocks the timekeeper reads (monotonic, wall) are handed in, so a test can put this host's
wall clock 20 s ahead or step the monotonic one under it; PostgreSQL is the real server."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from dispatcher.metrics import Metrics
from dispatcher.store.clock import ClockStore
from dispatcher.store.db import Database
from dispatcher.timing.timekeeper import RESYNC_GAP_S, Timekeeper


class Clocks:
    """A monotonic and a wall clock, each the real one plus an offset a test may change."""

    def __init__(self, *, wall_ahead_s: float = 0.0) -> None:
        self.mono_ahead_s = 0.0
        self.wall_ahead_s = wall_ahead_s

    def mono(self) -> float:
        return time.monotonic() + self.mono_ahead_s

    def wall(self) -> float:
        return time.time() + self.wall_ahead_s


@pytest.fixture
def store(db: Database) -> ClockStore:
    return ClockStore(db)


async def bracket(database_url: str, timekeeper: Timekeeper) -> tuple[float, float, float]:
    """The node's time before, PostgreSQL's clock as read in between, and the node's time after
    (a loaded machine only widens the bracket: the reading must fall inside it)."""
    connection = await asyncpg.connect(database_url)
    try:
        before = timekeeper.now()
        now = await connection.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
        after = timekeeper.now()
        return before, float(now), after
    finally:
        await connection.close()


# The node's time may be off by its estimate's error: half the best round trip, well under this.
WITHIN_S = 0.005


def keeper(store: ClockStore, clocks: Clocks, metrics: Metrics | None = None) -> Timekeeper:
    return Timekeeper(
        store, metrics or Metrics(), max_offset_s=1.0, mono=clocks.mono, wall=clocks.wall
    )


async def test_the_nodes_time_is_postgresqls_clock_whatever_the_wall_clock_says(
    store: ClockStore, database_url: str
) -> None:
    clocks = Clocks(wall_ahead_s=20.0)
    timekeeper = keeper(store, clocks)
    await timekeeper.start()
    before, db_now, after = await bracket(database_url, timekeeper)
    assert before - WITHIN_S <= db_now <= after + WITHIN_S
    assert timekeeper.describe()["offset_s"] == pytest.approx(20.0, abs=0.005)


async def test_a_wall_clock_past_the_limit_is_not_trusted_and_says_why(
    store: ClockStore,
) -> None:
    metrics = Metrics()
    timekeeper = keeper(store, Clocks(wall_ahead_s=20.0), metrics)
    await timekeeper.start()
    assert not timekeeper.trusted()
    state = timekeeper.describe()
    assert state["trusted"] is False
    reason = str(state["reason"])
    assert float(reason.split("this host's clock is ")[1].split()[0]) == pytest.approx(20, abs=0.01)
    assert "ahead of PostgreSQL's" in reason
    offset = metrics.registry.get_sample_value("dispatcher_clock_offset_seconds")
    assert offset == pytest.approx(20.0, abs=0.005)


async def test_a_wall_clock_within_the_limit_is_trusted_either_side(store: ClockStore) -> None:
    for ahead_s in (0.9, -0.9):
        timekeeper = keeper(store, Clocks(wall_ahead_s=ahead_s))
        await timekeeper.start()
        assert timekeeper.trusted(), timekeeper.describe()


async def test_a_wall_clock_put_right_is_trusted_at_the_next_sample(store: ClockStore) -> None:
    clocks = Clocks(wall_ahead_s=-20.0)
    timekeeper = keeper(store, clocks)
    await timekeeper.start()
    assert not timekeeper.trusted()
    assert "behind" in str(timekeeper.describe()["reason"])
    clocks.wall_ahead_s = 0.0
    await asyncio.sleep(RESYNC_GAP_S)  # a resync this soon after a sample is not taken
    await timekeeper.resync()
    assert timekeeper.trusted(), timekeeper.describe()


async def test_a_monotonic_clock_stepped_under_the_node_is_caught_by_the_next_sample(
    store: ClockStore, database_url: str
) -> None:
    clocks = Clocks()
    metrics = Metrics()
    timekeeper = keeper(store, clocks, metrics)
    await timekeeper.start()
    clocks.mono_ahead_s = 3600.0  # what no real monotonic clock does; a broken time source might
    assert timekeeper.now() > time.time() + 3500  # believed until measured again
    await asyncio.sleep(RESYNC_GAP_S)  # a resync this soon after a sample is not taken
    await timekeeper.resync()
    before, db_now, after = await bracket(database_url, timekeeper)
    assert before - WITHIN_S <= db_now <= after + WITHIN_S
    assert timekeeper.describe()["steps"] == 1
    assert metrics.registry.get_sample_value("dispatcher_clock_steps_total") == 1
