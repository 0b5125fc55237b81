"""A node's materialiser serves schedules fairly, against real PostgreSQL and RabbitMQ: beside more
schedules catching up than a pass takes, a schedule every 2 s still has each occurrence made
ahead of its time and fired on time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dispatcher.node import Node
from dispatcher.recurring.materialiser import SCHEDULES_PER_PASS
from dispatcher.recurring.model import ScheduleSpec, Template
from dispatcher.recurring.occurrences import Missed, Timing
from tests.support.nodes import running_node
from tests.support.waiting import until

# serial: it holds each tick to one second of lateness beside a backlog, which a loaded machine
# can exceed without the scheduler being unfair.
pytestmark = pytest.mark.serial

BACKLOGGED = SCHEDULES_PER_PASS + 20
BACKLOG_S = 300  # each of them missed this many seconds of occurrences, every one to make up
# How long before its time an occurrence becomes a job. Twice the tick: a pass that PostgreSQL or a
# loaded machine holds up a moment (one was seen to take 4.6 s in CI) leaves it time, while a live
# lane waiting for the backlog (over 10 s of catch-up) would still make the ticks late.
AHEAD_S = 4


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="fairness",
        shard_count=8,
        schedule_poll_s=0.2,
        schedule_ahead_s=AHEAD_S,
    ) as running:
        yield running


def spec(name: str, timing: Timing, missed: Missed) -> ScheduleSpec:
    template = Template(routing_key="fair.tick", payload=b"{}", headers={})
    return ScheduleSpec(name=name, timing=timing, template=template, missed=missed)


async def jobs_of(database_url: str, pattern: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(
            "SELECT run_at, created_at, dispatched_at, state FROM jobs"
            " WHERE idempotency_key LIKE $1 ORDER BY run_at",
            f"schedule:{pattern}:%",
        )
    finally:
        await connection.close()


async def test_a_schedule_every_2_s_fires_each_occurrence_on_time_beside_a_backlog(
    node: Node, database_url: str
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    behind = now - timedelta(seconds=BACKLOG_S)
    for index in range(BACKLOGGED):  # every second, each missed occurrence made up (36 000)
        timing = Timing(interval_s=1, start_at=behind)
        await node.recurring.schedules.create(
            spec(f"backlog-{index}", timing, Missed.ALL), namespace=None, next_at=behind
        )
    start = now + timedelta(seconds=AHEAD_S + 2)
    ticks = Timing(interval_s=2, start_at=start, end_at=start + timedelta(seconds=10))
    await node.recurring.schedules.create(
        spec("every-2s", ticks, Missed.SKIP), namespace=None, next_at=start
    )
    expected = [start + timedelta(seconds=2 * i) for i in range(6)]

    async def fired() -> bool:
        rows = await jobs_of(database_url, "every-2s")
        return len(rows) == len(expected) and all(row["state"] == "dispatched" for row in rows)

    await until(fired, 60)
    ticks_made = await jobs_of(database_url, "every-2s")
    backlog = await jobs_of(database_url, "backlog-%")
    # The backlog was still being worked off after the last tick was made: they interleaved.
    assert max(row["created_at"] for row in backlog) > ticks_made[-1]["created_at"]
    assert [row["run_at"] for row in ticks_made] == expected  # none dropped as missed
    for row in ticks_made:
        assert row["created_at"] < row["run_at"], row  # made ahead of its time
        assert row["dispatched_at"] - row["run_at"] < timedelta(seconds=1), row
