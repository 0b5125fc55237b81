"""The supervisor of background loops: restarts, backoff, degraded state, and what ends a node."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from dispatcher import errors, metrics, supervision
from dispatcher.store import db


def test_restarts_double_from_half_a_second_up_to_thirty() -> None:
    backoff = supervision.restarts()
    assert [backoff.next() for _ in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert [backoff.next() for _ in range(50)][-1] == supervision.MAX_BACKOFF_S


def test_a_backoff_keeps_its_first_pause_and_cap_and_starts_over_on_reset() -> None:
    backoff = supervision.Backoff(first_s=0.2, max_s=5.0)
    assert backoff.pause_s() == 0.2  # before any failure: the first pause
    assert [backoff.next() for _ in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert backoff.failures == 7
    backoff.reset()
    assert (backoff.failures, backoff.next()) == (0, 0.2)


def test_a_backoff_failing_for_hours_stays_at_its_cap() -> None:
    backoff = supervision.Backoff(first_s=0.1, max_s=5.0)
    assert [backoff.next() for _ in range(5000)][-1] == 5.0  # 0.1 * 2**4999 would overflow


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "FIRST_BACKOFF_S", 0.01)
    monkeypatch.setattr(supervision, "HEALTHY_AFTER_S", 0.05)


@pytest.mark.usefixtures("fast")
async def test_a_loop_that_raises_is_restarted_and_shown_degraded_until_it_runs_again() -> None:
    supervisor = supervision.Supervisor(metrics.Metrics())
    runs = 0
    release = asyncio.Event()
    third = asyncio.Event()

    async def body() -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise ZeroDivisionError("a bug")
        third.set()
        await release.wait()

    task = asyncio.create_task(supervisor.supervise("loop", body))
    await asyncio.wait_for(third.wait(), 5)
    assert supervisor.degraded() == {"loop": "ZeroDivisionError: a bug"}
    await asyncio.sleep(0.1)  # the third run outlasts HEALTHY_AFTER_S
    assert supervisor.degraded() == {}
    assert supervisor.loops["loop"].failures == 0
    release.set()
    await task  # a body that returns ends its loop
    assert runs == 3
    rendered = supervisor._metrics.render().decode()
    assert 'dispatcher_loop_failures_total{kind="unexpected",loop="loop"} 2.0' in rendered


@pytest.mark.usefixtures("fast")
async def test_a_transient_failure_is_counted_as_such() -> None:
    supervisor = supervision.Supervisor(metrics.Metrics())
    calls = 0

    async def body() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise errors.StoreUnavailable("down")

    await supervisor.supervise("loader", body)
    rendered = supervisor._metrics.render().decode()
    assert 'dispatcher_loop_failures_total{kind="transient",loop="loader"} 1.0' in rendered


async def test_a_loop_restarts_at_the_pace_its_row_gives() -> None:
    supervisor = supervision.Supervisor(metrics.Metrics())
    calls = 0

    async def body() -> None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise errors.BrokerUnavailable("not yet")

    pace = supervision.Backoff(first_s=0.01, max_s=0.02)
    # The default pace (0.5 s, 1 s, 2 s) would take 3.5 s for these three restarts.
    await asyncio.wait_for(supervisor.supervise("amqp-connect", body, pace), 1)
    assert calls == 4
    assert pace.failures == 0  # the row's backoff is a pattern: each loop counts on a copy
    rendered = supervisor._metrics.render().decode()
    assert 'dispatcher_loop_failures_total{kind="transient",loop="amqp-connect"} 3.0' in rendered


@pytest.mark.usefixtures("fast")
async def test_a_running_loop_reports_itself_degraded_and_recovered_without_a_restart() -> None:
    supervisor = supervision.Supervisor(metrics.Metrics())
    runs = 0
    said = asyncio.Event()
    go_on = asyncio.Event()
    release = asyncio.Event()

    async def marks() -> None:  # a task the body starts reports for the body's loop
        supervision.report_degraded("marks", errors.StoreUnavailable("connection refused"))
        said.set()
        await go_on.wait()
        supervision.report_recovered("marks")
        said.set()

    async def body() -> None:
        nonlocal runs
        runs += 1
        async with asyncio.TaskGroup() as group:
            group.create_task(marks())
            await release.wait()

    task = asyncio.create_task(supervisor.supervise("firing", body))
    await asyncio.wait_for(said.wait(), 5)
    said.clear()
    await asyncio.sleep(0.1)  # the run outlasts HEALTHY_AFTER_S: the report still stands
    assert supervisor.degraded() == {"firing": "marks: StoreUnavailable: connection refused"}
    gauge = 'dispatcher_loop_degraded{loop="firing"}'
    assert f"{gauge} 1.0" in supervisor._metrics.render().decode()
    go_on.set()
    await asyncio.wait_for(said.wait(), 5)
    assert supervisor.degraded() == {}
    assert f"{gauge} 0.0" in supervisor._metrics.render().decode()
    release.set()
    await task
    assert runs == 1  # never restarted


@pytest.mark.usefixtures("fast")
async def test_what_a_run_reported_ends_with_it() -> None:
    supervisor = supervision.Supervisor(metrics.Metrics())
    runs = 0
    second = asyncio.Event()
    release = asyncio.Event()

    async def body() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            supervision.report_degraded("recording", errors.StoreUnavailable("down"))
            raise ZeroDivisionError("a bug")
        second.set()
        await release.wait()

    task = asyncio.create_task(supervisor.supervise("events", body))
    await asyncio.wait_for(second.wait(), 5)
    await asyncio.sleep(0.1)  # the second run outlasts HEALTHY_AFTER_S
    assert supervisor.degraded() == {}
    release.set()
    await task


def test_a_report_outside_any_supervised_loop_does_nothing() -> None:
    supervision.report_degraded("marks", errors.StoreUnavailable("down"))
    supervision.report_recovered("marks")


async def test_a_fatal_error_leaves_the_loop() -> None:
    supervisor = supervision.Supervisor(metrics.Metrics())

    async def body() -> None:
        raise errors.ShardCountMismatch("16 here, 256 in the database")

    with pytest.raises(errors.ShardCountMismatch):
        await supervisor.supervise("ownership", body)


async def test_a_closing_supervisor_restarts_nothing() -> None:
    supervisor = supervision.Supervisor(metrics.Metrics())
    calls = 0

    async def body() -> None:
        nonlocal calls
        calls += 1
        supervisor.close()
        raise RuntimeError("failed while the node stops")

    await asyncio.wait_for(supervisor.supervise("firing", body), 1)
    assert calls == 1


async def test_cancelling_a_supervised_loop_cancels_its_body() -> None:
    supervisor = supervision.Supervisor(metrics.Metrics())
    cleaned = asyncio.Event()

    async def body() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    task = asyncio.create_task(supervisor.supervise("events", body))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()


async def test_a_body_that_swallows_one_cancellation_is_cancelled_again_until_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(supervision, "CANCEL_AGAIN_S", 0.05)
    supervisor = supervision.Supervisor(metrics.Metrics())
    cancellations = 0

    async def body() -> None:
        nonlocal cancellations
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancellations += 1
                if cancellations == 3:
                    raise
                # swallowed, as a library closing a cancelled call's channel does

    task = asyncio.create_task(supervisor.supervise("events", body))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert cancellations == 3


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (asyncpg.QueryCanceledError("canceling statement due to user request"), True),  # 57014
        (asyncpg.AdminShutdownError("terminating connection"), True),  # 57P01
        (asyncpg.TooManyConnectionsError("too many clients"), True),  # 53300
        (asyncpg.DiskFullError("no space left"), True),  # 53100
        (asyncpg.ReadOnlySQLTransactionError("read-only transaction"), True),  # 25006
        (asyncpg.SerializationError("could not serialize"), True),  # 40001
        (asyncpg.DeadlockDetectedError("deadlock detected"), True),  # 40P01
        (asyncpg.ConnectionDoesNotExistError("closed"), True),  # 08003
        (asyncpg.InterfaceError("connection is closed"), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (asyncpg.UniqueViolationError("duplicate key"), False),  # 23505: a bug, not an outage
        (asyncpg.DataError("invalid input"), False),
        (asyncpg.UndefinedTableError("no such table"), False),
        (ValueError("not a database error"), False),
    ],
)
def test_the_database_errors_that_heal_by_themselves_are_the_transient_ones(
    exc: BaseException, transient: bool
) -> None:
    assert db.is_unavailable(exc) is transient


async def test_rounds_show_a_round_failing_on_the_database_degraded_and_go_on() -> None:
    """The polling loops' one shape: a round PostgreSQL failed is reported and tried again after
    the rest; the next that works clears it; the loop is never restarted."""
    supervisor = supervision.Supervisor(metrics.Metrics())
    paused: list[str] = []
    rounds = supervision.Rounds("passes", 0.01, on_paused=lambda exc: paused.append(str(exc)))
    outcomes = iter([errors.StoreUnavailable("down"), errors.StoreUnavailable("down"), None])
    degraded_seen: list[dict[str, str]] = []
    runs = 0

    async def work() -> None:
        degraded_seen.append(supervisor.degraded())
        failure = next(outcomes, None)
        if failure is not None:
            raise failure
        rounds.stop()

    async def body() -> None:
        nonlocal runs
        runs += 1
        await rounds.run(work)

    await asyncio.wait_for(supervisor.supervise("schedules", body), 5)
    assert paused == ["down", "down"]
    down = {"schedules": "passes: StoreUnavailable: down"}
    assert degraded_seen == [{}, down, down]  # shown from the first failure to the next success
    assert supervisor.degraded() == {}  # the round that worked cleared it
    assert runs == 1


async def test_rounds_rest_between_rounds_unless_busy_woken_or_stopped() -> None:
    rounds = supervision.Rounds("bulk", 3600, on_paused=lambda exc: None)
    started: list[float] = []
    busy = iter([True, True, False])

    async def work() -> bool:
        started.append(asyncio.get_running_loop().time())
        return next(busy, False)

    task = asyncio.create_task(rounds.run(work))
    await asyncio.sleep(0.05)
    assert len(started) == 3  # two busy rounds, each followed by the next at once; then a rest
    rounds.wake()
    await asyncio.sleep(0.05)
    assert len(started) == 4  # woken: the next round without waiting out the hour
    rounds.stop()
    await asyncio.wait_for(task, 1)  # stopped during its rest: no round more
    assert len(started) == 4
    await asyncio.wait_for(rounds.pause(3600), 1)  # a pause within a round ends at stop too


async def test_rounds_leave_anything_but_the_database_being_away_to_the_supervisor() -> None:
    rounds = supervision.Rounds("counts", 0.01, on_paused=lambda exc: None)

    async def work() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        await asyncio.wait_for(rounds.run(work), 1)
