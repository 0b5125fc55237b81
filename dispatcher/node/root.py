"""The node: its subsystems built in dependency order, started in order, stopped in reverse.
Background loops run as named, supervised tasks in one TaskGroup, created and stopped from one
table (``lifecycle``) that each subsystem adds its rows to: a failing loop is restarted after a
backoff and shown in /readyz; only what cannot heal (``errors.Fatal``) or the HTTP server stopping
ends the node."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from dispatcher import errors, lifecycle, supervision
from dispatcher.lifecycle import Task
from dispatcher.node.bulk import Bulk, build_bulk
from dispatcher.node.coordination import Coordination, build_coordination
from dispatcher.node.core import Core, build_core
from dispatcher.node.dependents import Dependents, build_dependents
from dispatcher.node.firing import Firing, build_firing
from dispatcher.node.messaging import Messaging, build_messaging
from dispatcher.node.recurring import Recurring, build_recurring
from dispatcher.node.serving import Served, Serving, build_serving
from dispatcher.node.status import Status
from dispatcher.node.submission import Submission, build_submission
from dispatcher.node.upkeep import Upkeep, build_upkeep
from dispatcher.settings import Settings
from dispatcher.store import migrate
from dispatcher.timing.kinds import Mono

# The node's log lines keep the name operators filter on.
logger = logging.getLogger("dispatcher.node")


class Subsystem(Protocol):
    def tasks(self) -> list[Task]: ...


class Node:
    def __init__(self, settings: Settings, *, mono: Mono = time.monotonic) -> None:
        """MONO: the clock the node's time is measured from (a test steps it under the node)."""
        self.settings = settings
        self._stop = asyncio.Event()
        self.started = asyncio.Event()
        self.core: Core = build_core(settings, mono=mono)
        self.coordination: Coordination = build_coordination(self.core)
        self.messaging: Messaging = build_messaging(self.core)
        self.firing: Firing = build_firing(self.core, self.coordination, self.messaging)
        self.submission: Submission = build_submission(self.core, self.coordination, self.firing)
        self.upkeep: Upkeep = build_upkeep(self.core, self.coordination, self.messaging)
        self.recurring: Recurring = build_recurring(self.core, self.submission)
        self.dependents: Dependents = build_dependents(self.core)
        self.bulk: Bulk = build_bulk(self.core, self.coordination, self.firing)
        self.status = Status(self.core, self.messaging, self.coordination, self.firing, self.upkeep)
        served = Served(
            self.messaging,
            self.coordination,
            self.firing,
            self.submission,
            self.upkeep,
            self.recurring,
            self.bulk,
            self.status,
        )
        self.serving: Serving = build_serving(self.core, served, stopping=self._stop.is_set)

    def subsystems(self, *, serve_http: bool = True) -> list[Subsystem]:
        """In start order. Stopping (``lifecycle``) takes the HTTP server first, then firing and
        what makes jobs drain, then leaves the cluster; the rest is cancelled in reverse, the
        connections last."""
        return [
            self.core,
            self.messaging,
            self.coordination,
            self.submission,
            self.firing,
            self.upkeep,
            self.recurring,
            self.dependents,
            self.bulk,
            *([self.serving] if serve_http else []),
        ]

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self, *, serve_http: bool = True) -> None:
        """Start everything, run until ``request_stop``, then stop phase by phase. Raises
        ``errors.HttpServerUnsupported`` first, before any service is touched, if SERVE_HTTP and
        the installed uvicorn is not the one the HTTP edge's guards were written for."""
        if serve_http:
            self.serving.http.require()
        table = [row for part in self.subsystems(serve_http=serve_http) for row in part.tasks()]
        supervisor = self.core.supervisor
        try:
            if not await self._start():
                return  # asked to stop before the services answered
            tasks = lifecycle.Tasks(table, supervise=supervisor.supervise)
            async with asyncio.TaskGroup() as group:
                tasks.start(group)
                self.started.set()
                await self._stop.wait()
                logger.info("stopping", extra={"action": "stop"})
                supervisor.close()
                await tasks.stop()
        finally:
            await _closed("ownership", self.coordination.ownership.stop())
            await _closed("publisher", self.messaging.publisher.close())
            await _closed("live publisher", self.messaging.live_publisher.close())
            await _closed("database pool", self.core.db.close())
            logger.info("stopped", extra={"action": "stopped"})

    async def _start(self) -> bool:
        """Open the pool, migrate, join: retried while a service is away (a node started before
        its database, say); False when asked to stop meanwhile."""
        backoff = supervision.restarts()
        settings = self.settings
        while not self._stop.is_set():
            try:
                await self.core.db.open()
                if settings.migrate_on_start:
                    await migrate.apply_migrations(settings.database_url)
                else:
                    await migrate.check(settings.database_url)
                await self.core.timekeeper.start()
                await self.firing.flow.load()
                await self.serving.log_auth_mode(settings.http_host, settings.http_port)
                await self.coordination.ownership.start()
                return True
            except errors.TRANSIENT as exc:
                delay = backoff.next()
                logger.warning(
                    "starting: %s; trying again in %.1fs", exc, delay, extra={"action": "start"}
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
        return False


# A stop never hangs on a service: each close is given this long (a broker slow to answer its
# Close, a connection the pool waits for), then left behind (the process is ending).
CLOSE_TIMEOUT_S = 5.0


async def _closed(what: str, closing: Coroutine[Any, Any, None]) -> None:
    started = time.monotonic()
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await closing
    except TimeoutError:
        logger.warning(
            "stopping: closing the %s took over %.0fs; left behind",
            what,
            CLOSE_TIMEOUT_S,
            extra={"action": "stop"},
        )
    except Exception as exc:  # a close that failed: the next one must still run
        logger.warning("stopping: closing the %s failed: %r", what, exc, extra={"action": "stop"})
    else:
        if (took_s := time.monotonic() - started) > 1.0:
            logger.info("stopping: closing the %s took %.1fs", what, took_s)
