"""The HTTP API: the keyring callers are checked against, the routes with what they may see of the
node (``ApiContext``), and the server that runs them."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.api import app
from dispatcher.api.app import Api
from dispatcher.api.context import ApiContext
from dispatcher.api.server import HttpServer
from dispatcher.auth.keyring import Keyring
from dispatcher.lifecycle import Phase, Task
from dispatcher.node.bulk import Bulk
from dispatcher.node.coordination import Coordination
from dispatcher.node.core import Core
from dispatcher.node.firing import Firing
from dispatcher.node.messaging import Messaging
from dispatcher.node.recurring import Recurring
from dispatcher.node.status import Status
from dispatcher.node.submission import Submission
from dispatcher.node.upkeep import Upkeep
from dispatcher.store.api_keys import KeyStore

# The node's log lines keep the name operators filter on.
logger = logging.getLogger("dispatcher.node")


@dataclass(frozen=True, slots=True)
class Serving:
    keyring: Keyring
    app: Api
    http: HttpServer
    stopping: Callable[[], bool]  # whether the node is stopping: the server then finishes

    def tasks(self) -> list[Task]:
        # A server that stops on its own ends the node: it is not restarted.
        return [Task("http", self._serve, Phase.SERVE, self.http.stop, supervised=False)]

    async def _serve(self) -> None:
        await self.http.serve(stopping=self.stopping)

    async def log_auth_mode(self, host: str, port: int) -> None:
        if await self.keyring.enabled():
            logger.info("API keys required", extra={"action": "auth"})
            return
        logger.warning(
            "the API is OPEN at http://%s:%d: no API key is configured, every caller may do "
            "everything",
            host,
            port,
            extra={"action": "auth"},
        )
        if not _is_loopback(host):
            logger.warning(
                "the open API is bound to %s, beyond this machine: configure an API key "
                "(DISPATCHER_API_KEYS) or bind to 127.0.0.1",
                host,
                extra={"action": "auth"},
            )


@dataclass(frozen=True, slots=True)
class Served:
    """The subsystems whose parts the routes use."""

    messaging: Messaging
    coordination: Coordination
    firing: Firing
    submission: Submission
    upkeep: Upkeep
    recurring: Recurring
    bulk: Bulk
    status: Status


def build_serving(core: Core, served: Served, *, stopping: Callable[[], bool]) -> Serving:
    settings = core.settings
    keyring = Keyring(
        static=settings.static_keys(),
        store=KeyStore(core.db),
        cache_s=settings.api_key_cache_s,
        required=settings.api_auth_required,
    )
    keyring.listen(core.notices)
    api = app.create_api(_api_context(core, served, keyring))
    return Serving(
        keyring=keyring,
        app=api,
        http=HttpServer(settings, api, core.metrics),
        stopping=stopping,
    )


def _api_context(core: Core, served: Served, keyring: Keyring) -> ApiContext:
    """What the routes use: the API sees these, never the node."""
    publisher, flow = served.messaging.publisher, served.firing.flow
    return ApiContext(
        settings=core.settings,
        intake=served.submission.intake,
        jobs=core.jobs,
        history=served.messaging.history,
        schedules=served.recurring.schedules,
        keyring=keyring,
        metrics=core.metrics,
        now_dt=core.timekeeper.now_dt,
        readiness=served.status.readiness,
        degraded=core.supervisor.degraded,
        clock=core.timekeeper.describe,
        standing=served.status.standing,
        publish_path=lambda: {"path": publisher.path, "fallback_reason": publisher.fallback_reason},
        counts=lambda: served.upkeep.housekeeper.snapshot,
        heap_size=lambda: served.firing.lanes.live_count,
        cluster=served.coordination.ownership.describe,
        vacuum=served.upkeep.vacuum_watch.horizon.describe,
        flow_rules=flow.store,
        rules=lambda: flow.book,
        rules_changed=flow.refresh,
        bulk_actions=served.bulk.actions,
        bulk_started=served.bulk.runner.wake,
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (or 0.0.0.0, ::): assume it is reachable from elsewhere
