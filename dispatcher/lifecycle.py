"""A node's background tasks as one table: each row names a task, how it runs and when it stops.
The tasks start in table order and stop by phase:

    SERVE   told to stop, then awaited: the HTTP server takes no new request
    DRAIN   told to stop, then awaited up to ``DRAIN_TIMEOUT_S``: batches in flight are confirmed
            and marked, not left to a lease
    LEAVE   told to stop (awaited): the cluster is left, so others take the shards at once
    CANCEL  every task still running, one after the other in reverse start order (each ends
            before the tasks started ahead of it, which it may use, are cancelled)

A task is told to stop by its row's ``stop``; one without ``stop`` is only ever cancelled."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from dispatcher import supervision

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 10.0

Body = Callable[[], Coroutine[Any, Any, None]]
Supervise = Callable[[str, Body, supervision.Backoff | None], Coroutine[Any, Any, None]]


class Phase(IntEnum):
    SERVE = 1
    DRAIN = 2
    LEAVE = 3
    CANCEL = 4


# How long each phase waits for its tasks to end once told to stop (None: as long as they take;
# 0: not at all, the stop itself is what the phase is for).
PHASE_WAIT_S: dict[Phase, float | None] = {
    Phase.SERVE: DRAIN_TIMEOUT_S,
    Phase.DRAIN: DRAIN_TIMEOUT_S,
    Phase.LEAVE: 0,
}


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    run: Body
    phase: Phase = Phase.CANCEL
    stop: Callable[[], Awaitable[None] | None] | None = None  # tells the task to finish
    supervised: bool = True  # restarted after a failure (``supervision``); else it ends the node
    backoff: supervision.Backoff | None = None  # its restarts' pace; None: ``restarts()``


class Tasks:
    """The running tasks of one table, started into a TaskGroup and stopped phase by phase."""

    def __init__(self, table: Sequence[Task], *, supervise: Supervise) -> None:
        names = [row.name for row in table]
        if len(set(names)) != len(names):
            raise ValueError(f"task names repeat: {names}")
        self._table = list(table)
        self._supervise = supervise
        self._running: dict[str, asyncio.Task[None]] = {}

    def start(self, group: asyncio.TaskGroup) -> None:
        for row in self._table:
            body = self._supervise(row.name, row.run, row.backoff) if row.supervised else row.run()
            self._running[row.name] = group.create_task(body, name=row.name)

    async def stop(self) -> None:
        for phase in (Phase.SERVE, Phase.DRAIN, Phase.LEAVE):
            rows = [row for row in self._table if row.phase is phase]
            for row in rows:
                if row.stop is not None and inspect.isawaitable(stopping := row.stop()):
                    await stopping
            tasks = [self._running[row.name] for row in rows]
            wait_s = PHASE_WAIT_S[phase]
            if tasks and wait_s != 0:
                _, late = await asyncio.wait(tasks, timeout=wait_s)
                for task in late:
                    logger.warning(
                        "task %s did not stop within %.0fs; cancelling it",
                        task.get_name(),
                        wait_s,
                        extra={"action": "stop"},
                    )
        for row in reversed(self._table):
            task = self._running[row.name]
            task.cancel()
            await asyncio.wait({task})
