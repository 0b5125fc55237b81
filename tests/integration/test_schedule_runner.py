"""The materialiser against a real PostgreSQL, with a clock of its own: a pass cut off between
storing jobs and advancing leaves the schedule where it was and the next pass adds nothing twice;
concurrent passes (two nodes) make each occurrence once; the missed policies after downtime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dispatcher import models
from dispatcher.node import Node
from dispatcher.schedules.model import ScheduleSpec, Template
from dispatcher.schedules.occurrences import Missed, Timing
from dispatcher.schedules.runner import Materialiser
from tests.support.nodes import running_node

START = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    # The node's own materialiser looks far ahead of nothing: it polls rarely so the test's
    # passes are the ones that run.
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="runner",
        shard_count=8,
        schedule_poll_s=3600,
    ) as running:
        yield running


def spec(name: str, missed: Missed = Missed.ALL) -> ScheduleSpec:
    return ScheduleSpec(
        name=name,
        timing=Timing(interval_s=10, start_at=START),
        template=Template(routing_key="runner.tick", payload=b"{}", headers={}),
        missed=missed,
        grace_s=30,
    )


def materialiser(
    node: Node, intake: object, now: datetime, per_schedule: int = 1000
) -> Materialiser:
    return Materialiser(
        node.schedules,
        intake,  # type: ignore[arg-type]
        ahead_s=15,
        poll_s=1,
        per_schedule=per_schedule,
        clock=lambda: now,
    )


async def run_ats(database_url: str, name: str) -> list[datetime]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT run_at FROM jobs WHERE idempotency_key LIKE $1 ORDER BY run_at",
            f"schedule:{name}:%",
        )
    finally:
        await connection.close()
    return [row["run_at"] for row in rows]


class CrashAfterStoring:
    """An intake that stores the jobs, then fails: the crash between insert and advance."""

    def __init__(self, node: Node) -> None:
        self._intake = node.intake

    async def submit(
        self, specs: Sequence[models.JobSpec], *, namespace: str | None = None
    ) -> list[models.Submitted]:
        await self._intake.submit(specs, namespace=namespace)
        raise RuntimeError("crash")


async def test_a_pass_cut_off_after_storing_jobs_is_redone_without_duplicates(
    node: Node, database_url: str
) -> None:
    now = START + timedelta(seconds=25)
    await node.schedules.create(spec("redo"), namespace=None, next_at=START)
    with pytest.raises(RuntimeError, match="crash"):
        await materialiser(node, CrashAfterStoring(node), now).run_pass()
    stored = await run_ats(database_url, "redo")
    assert stored == [START + timedelta(seconds=10 * i) for i in range(5)]  # up to now + 15 s
    assert (await node.schedules.get("redo", namespace=None)).next_at == START  # not advanced
    assert await materialiser(node, node.intake, now).run_pass() == 1
    assert await run_ats(database_url, "redo") == stored
    advanced = await node.schedules.get("redo", namespace=None)
    assert advanced.next_at == START + timedelta(seconds=50)
    assert advanced.last_fired_at == START + timedelta(seconds=40)


async def test_concurrent_passes_make_each_occurrence_once(node: Node, database_url: str) -> None:
    for index in range(20):
        await node.schedules.create(spec(f"many-{index}"), namespace="team", next_at=START)
    now = START + timedelta(seconds=100)
    passes = [materialiser(node, node.intake, now) for _ in range(4)]
    handled = await asyncio.gather(*(p.run_pass() for p in passes))
    # Locked rows are skipped, not waited for: no schedule is handled twice.
    assert sum(handled) == 20
    for index in range(20):
        assert len(await run_ats(database_url, f"many-{index}")) == 12  # 0..110 s
    assert await asyncio.gather(*(p.run_pass() for p in passes)) == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("missed", "first_offsets_s"),
    [
        (Missed.ALL, [0, 10, 20]),  # every missed one, oldest first
        (Missed.LATEST, [3560, 3570, 3580]),  # only the latest missed (now - 40 s), then on time
        (Missed.SKIP, [3570, 3580, 3590]),  # none missed: from now - 30 s (within the grace)
    ],
)
async def test_missed_policy_after_an_hour_down(
    node: Node, database_url: str, missed: Missed, first_offsets_s: list[int]
) -> None:
    await node.schedules.create(spec("down", missed), namespace=None, next_at=START)
    now = START + timedelta(hours=1)
    runner = materialiser(node, node.intake, now, per_schedule=100)
    while await runner.run_pass():
        pass
    made = await run_ats(database_url, "down")
    assert made[:3] == [START + timedelta(seconds=s) for s in first_offsets_s]
    assert made[-1] == now + timedelta(seconds=10)
    if missed is Missed.ALL:
        assert len(made) == 362  # 0..3610 s, over several bounded passes


async def test_the_materialiser_task_stops_when_asked(node: Node) -> None:
    runner = materialiser(node, node.intake, START)
    task = asyncio.create_task(runner.run(), name="test-materialiser")
    await asyncio.sleep(0.2)
    assert not task.done()  # it waits for its next pass
    runner.stop()
    await asyncio.wait_for(task, 5)
