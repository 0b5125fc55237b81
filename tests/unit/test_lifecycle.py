"""The table of tasks: started in table order, stopped phase by phase (serve, drain, leave), the
rest cancelled one by one in reverse start order; a task that does not drain in time is
cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from dispatcher import lifecycle, supervision
from dispatcher.lifecycle import Phase, Task


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.told: dict[str, asyncio.Event] = {}

    def body(self, name: str, *, drains: bool = True) -> Callable[[], Awaitable[None]]:
        """A task body that runs until cancelled or, if it ``drains``, until told to stop."""
        told = asyncio.Event()
        self.told[name] = told

        async def run() -> None:
            self.events.append(f"start {name}")
            try:
                if drains:
                    await told.wait()
                else:
                    await asyncio.Event().wait()
                self.events.append(f"drained {name}")
            except asyncio.CancelledError:
                self.events.append(f"cancelled {name}")
                raise

        return run

    def stop(self, name: str) -> Callable[[], None]:
        def stop() -> None:
            self.events.append(f"told {name}")
            self.told[name].set()

        return stop


async def unsupervised(
    name: str, body: Callable[[], Awaitable[None]], backoff: supervision.Backoff | None
) -> None:
    await body()


async def run_table(table: list[Task]) -> None:
    tasks = lifecycle.Tasks(table, supervise=unsupervised)
    async with asyncio.TaskGroup() as group:
        tasks.start(group)
        await asyncio.sleep(0)  # every task has started
        await tasks.stop()


async def test_tasks_stop_by_phase_then_the_rest_in_reverse_start_order() -> None:
    rec = Recorder()
    leave_events: list[str] = []

    async def leave() -> None:
        rec.events.append("told ownership")
        leave_events.append("left")

    table = [
        Task("connect", rec.body("connect", drains=False)),
        Task("ownership", rec.body("ownership", drains=False), Phase.LEAVE, leave),
        Task("loader", rec.body("loader", drains=False)),
        Task("firing", rec.body("firing"), Phase.DRAIN, rec.stop("firing")),
        Task("events", rec.body("events", drains=False)),
        Task("http", rec.body("http"), Phase.SERVE, rec.stop("http")),
    ]
    await asyncio.wait_for(run_table(table), 10)
    stops = [event for event in rec.events if not event.startswith("start")]
    assert stops == [
        "told http",
        "drained http",
        "told firing",
        "drained firing",
        "told ownership",
        "cancelled events",
        "cancelled loader",
        "cancelled ownership",
        "cancelled connect",
    ]
    assert leave_events == ["left"]


async def test_a_task_that_does_not_drain_in_time_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(lifecycle.PHASE_WAIT_S, Phase.DRAIN, 0.2)
    rec = Recorder()
    table = [Task("firing", rec.body("firing", drains=False), Phase.DRAIN, rec.stop("firing"))]
    await asyncio.wait_for(run_table(table), 10)
    assert rec.events == ["start firing", "told firing", "cancelled firing"]


def test_task_names_are_unique() -> None:
    async def body() -> None:
        return None

    with pytest.raises(ValueError, match="repeat"):
        lifecycle.Tasks([Task("a", body), Task("a", body)], supervise=unsupervised)
