"""The materialiser against a real PostgreSQL, with a clock of its own: a pass cut off between
storing jobs and advancing leaves the schedule where it was and the next pass adds nothing twice;
concurrent passes (two nodes) make each occurrence once; the missed policies after downtime; the
live lane served before a backlog, which is worked round robin; a schedule that cannot be planned
or stored is parked beside the others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dispatcher import errors, models
from dispatcher.node import Node
from dispatcher.recurring.materialiser import Materialiser
from dispatcher.recurring.model import ScheduleSpec, Template
from dispatcher.recurring.occurrences import Missed, Timing
from tests.support.nodes import running_node

START = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    # The node's own materialiser is stopped once its first pass is over, so the test's passes are
    # the only ones (a pass of its own would hold the rows the test's pass then skips).
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="runner",
        shard_count=8,
        schedule_poll_s=3600,
    ) as running:
        running.recurring.materialiser.stop()
        [own] = [task for task in asyncio.all_tasks() if task.get_name() == "schedules"]
        await asyncio.wait_for(own, 10)
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
        node.recurring.schedules,
        intake,  # type: ignore[arg-type]
        ahead_s=15,
        poll_s=1,
        per_schedule=per_schedule,
        metrics=node.core.metrics,
        now_dt=lambda: now,
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
    """An intake that stores the jobs, then loses the database: the crash between insert and
    advance."""

    def __init__(self, node: Node) -> None:
        self._intake = node.submission.intake

    async def submit(
        self, specs: Sequence[models.JobSpec], *, namespace: str | None = None
    ) -> list[models.Submitted]:
        await self._intake.submit(specs, namespace=namespace)
        raise errors.StoreUnavailable("crash")


async def test_a_pass_cut_off_after_storing_jobs_is_redone_without_duplicates(
    node: Node, database_url: str
) -> None:
    now = START + timedelta(seconds=25)
    await node.recurring.schedules.create(spec("redo"), namespace=None, next_at=START)
    with pytest.raises(errors.StoreUnavailable, match="crash"):
        await materialiser(node, CrashAfterStoring(node), now).run_pass()
    stored = await run_ats(database_url, "redo")
    assert stored == [START + timedelta(seconds=10 * i) for i in range(5)]  # up to now + 15 s
    assert (
        await node.recurring.schedules.get("redo", namespace=None)
    ).next_at == START  # not advanced
    assert await materialiser(node, node.submission.intake, now).run_pass() == 1
    assert await run_ats(database_url, "redo") == stored
    advanced = await node.recurring.schedules.get("redo", namespace=None)
    assert advanced.next_at == START + timedelta(seconds=50)
    assert advanced.last_fired_at == START + timedelta(seconds=40)


async def test_concurrent_passes_make_each_occurrence_once(node: Node, database_url: str) -> None:
    for index in range(20):
        await node.recurring.schedules.create(
            spec(f"many-{index}"), namespace="team", next_at=START
        )
    now = START + timedelta(seconds=100)
    passes = [materialiser(node, node.submission.intake, now) for _ in range(4)]
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
    await node.recurring.schedules.create(spec("down", missed), namespace=None, next_at=START)
    now = START + timedelta(hours=1)
    runner = materialiser(node, node.submission.intake, now, per_schedule=100)
    while await runner.run_pass():
        pass
    made = await run_ats(database_url, "down")
    assert made[:3] == [START + timedelta(seconds=s) for s in first_offsets_s]
    assert made[-1] == now + timedelta(seconds=10)
    if missed is Missed.ALL:
        assert len(made) == 362  # 0..3610 s, over several bounded passes


async def test_the_materialiser_task_stops_when_asked(node: Node) -> None:
    runner = materialiser(node, node.submission.intake, START)
    task = asyncio.create_task(runner.run(), name="test-materialiser")
    await asyncio.sleep(0.2)
    assert not task.done()  # it waits for its next pass
    runner.stop()
    await asyncio.wait_for(task, 5)


async def schedule_row(database_url: str, name: str) -> asyncpg.Record:
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow("SELECT * FROM schedules WHERE name = $1", name)
    finally:
        await connection.close()
    assert row is not None
    return row


async def test_the_live_lane_is_served_before_a_backlog_larger_than_a_pass(
    node: Node, database_url: str
) -> None:
    """More schedules behind than a pass takes: the one due on time still gets its jobs in the
    first pass (ordered by next_at alone, it came after all of them), and two passes give every
    schedule behind a turn."""
    now = START + timedelta(hours=1)
    for index in range(150):
        await node.recurring.schedules.create(
            spec(f"behind-{index}"), namespace=None, next_at=START
        )
    due = now + timedelta(seconds=10)
    await node.recurring.schedules.create(spec("on-time"), namespace=None, next_at=due)
    runner = materialiser(node, node.submission.intake, now)
    await runner.run_pass()
    assert await run_ats(database_url, "on-time") == [due]
    # A pass's catch-up is shared: 1000 jobs over the 100 schedules it took, 10 each.
    made = [len(await run_ats(database_url, f"behind-{index}")) for index in range(150)]
    assert sorted(made) == [0] * 50 + [10] * 100
    await runner.run_pass()  # the 50 not served yet come first
    for index in range(150):
        assert await run_ats(database_url, f"behind-{index}"), index


async def test_a_schedule_that_cannot_be_planned_is_parked_and_the_others_go_on(
    node: Node, database_url: str
) -> None:
    await node.recurring.schedules.create(spec("fine"), namespace=None, next_at=START)
    broken = ScheduleSpec(
        name="broken",
        timing=Timing(cron="* * * * *", timezone="Mars/Olympus", start_at=START),
        template=Template(routing_key="runner.tick", payload=b"{}", headers={}),
    )
    await node.recurring.schedules.create(broken, namespace=None, next_at=START)
    now = START + timedelta(seconds=25)
    runner = materialiser(node, node.submission.intake, now)
    assert await runner.run_pass() == 2
    assert len(await run_ats(database_url, "fine")) == 5
    parked = await node.recurring.schedules.get("broken", namespace=None)
    assert parked.spec.paused
    assert parked.next_at == START  # not advanced
    assert parked.error is not None
    assert "ZoneInfoNotFoundError" in parked.error
    assert "dispatcher_schedules_parked_total 1.0" in node.core.metrics.render().decode()
    # Parked, it is not retried every pass.
    assert await runner.run_pass() == 0


class RefusingIntake:
    """Stores jobs, except that PostgreSQL refuses those of one routing key."""

    def __init__(self, node: Node, refused_key: str) -> None:
        self._intake = node.submission.intake
        self._refused_key = refused_key

    async def submit(
        self, specs: Sequence[models.JobSpec], *, namespace: str | None = None
    ) -> list[models.Submitted]:
        if any(spec.routing_key == self._refused_key for spec in specs):
            raise errors.JobRefused("value out of range")
        return await self._intake.submit(specs, namespace=namespace)


async def test_a_schedule_whose_jobs_are_refused_is_parked_and_the_batch_is_stored(
    node: Node, database_url: str
) -> None:
    await node.recurring.schedules.create(spec("fine"), namespace="team", next_at=START)
    refused = ScheduleSpec(
        name="refused",
        timing=Timing(interval_s=10, start_at=START),
        template=Template(routing_key="runner.refused", payload=b"{}", headers={}),
    )
    await node.recurring.schedules.create(refused, namespace="team", next_at=START)
    now = START + timedelta(seconds=25)
    assert await materialiser(node, RefusingIntake(node, "runner.refused"), now).run_pass() == 2
    assert len(await run_ats(database_url, "fine")) == 5
    assert await run_ats(database_url, "refused") == []
    row = await schedule_row(database_url, "refused")
    assert row["paused"]
    assert row["error"] == "its jobs cannot be stored: JobRefused: value out of range"


async def test_times_stored_as_infinity_before_the_bounds_are_read_as_their_instants(
    node: Node, database_url: str
) -> None:
    """0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z were stored as -infinity and
    infinity (read back naive: the materialiser then raised TypeError and the node stopped)."""
    await node.recurring.schedules.create(spec("extremes"), namespace=None, next_at=START)
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "UPDATE schedules SET start_at = '-infinity', end_at = 'infinity' WHERE name = $1",
            "extremes",
        )
    finally:
        await connection.close()
    stored = await node.recurring.schedules.get("extremes", namespace=None)
    assert stored.spec.timing.start_at == datetime.min.replace(tzinfo=UTC)
    assert stored.spec.timing.end_at == datetime.max.replace(tzinfo=UTC)
    now = START + timedelta(seconds=25)
    assert await materialiser(node, node.submission.intake, now).run_pass() == 1
    assert len(await run_ats(database_url, "extremes")) == 5
    assert (await node.recurring.schedules.get("extremes", namespace=None)).error is None
