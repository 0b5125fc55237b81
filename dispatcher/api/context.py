"""What the routes use, and nothing more: the node builds an ``ApiContext`` from its parts and hands
it to ``create_api``; a test builds one from its own. No module of ``dispatcher.api`` imports
the node (the routes would otherwise reach into whatever it holds)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from dispatcher.auth.keyring import Keyring
from dispatcher.flow.rules import RuleBook
from dispatcher.intake.service import Intake
from dispatcher.metrics import Metrics
from dispatcher.settings import Settings
from dispatcher.store.bulk_actions import BulkActionStore
from dispatcher.store.flow_rules import FlowRuleStore
from dispatcher.store.history import HistoryStore
from dispatcher.store.jobs import JobStore
from dispatcher.store.schedules import ScheduleStore
from dispatcher.timing.kinds import NodeDate
from dispatcher.upkeep.housekeeping import Snapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiContext:
    settings: Settings  # the limits applied to requests, and the names /v1/stats shows
    intake: Intake  # new jobs and requeues
    jobs: JobStore  # job queries: get, page, reschedule, cancel
    history: HistoryStore  # a job's events, the next jobs due
    schedules: ScheduleStore
    keyring: Keyring
    metrics: Metrics
    # The node's time (PostgreSQL's clock, measured: timekeeper.py) for delay_ms, expiry and
    # schedules; never the host's wall clock.
    now_dt: NodeDate
    # /readyz: each check by name, then the failing background loops with their last error, and
    # the clock: this host's measured offset from PostgreSQL's, and whether the node fires on it.
    readiness: Callable[[], Awaitable[dict[str, bool]]]
    degraded: Callable[[], dict[str, str]]
    clock: Callable[[], dict[str, object]]
    # What the node can do now (``health``): its standing, the failing services, the last claim
    # and confirm.
    standing: Callable[[], dict[str, object]]
    publish_path: Callable[[], dict[str, str | None]]  # the firing publisher's path and why
    # /v1/stats: the last job counts and how many jobs this node holds in memory.
    counts: Callable[[], Snapshot]
    heap_size: Callable[[], int]
    cluster: Callable[[], Awaitable[dict[str, object]]]  # /v1/cluster: members and shards
    # /readyz: the oldest snapshot holding vacuum back, and whether it is past the warning.
    vacuum: Callable[[], dict[str, object]]
    # /v1/limits: the flow rules as stored; the node's rules as it applies them (a job's
    # ``held_by``); ``rules_changed`` makes this node's watch read them again (before answering).
    flow_rules: FlowRuleStore
    rules: Callable[[], RuleBook]
    rules_changed: Callable[[], Awaitable[None]]
    # /v1/bulk-actions: the actions as stored; ``bulk_started`` has this node's runner look at
    # once for an action just made or resumed.
    bulk_actions: BulkActionStore
    bulk_started: Callable[[], None]


async def get_deps(request: Request) -> ApiContext:
    # async on purpose: FastAPI runs a sync dependency in its thread pool on every request.
    context: ApiContext = request.app.state.context
    return context


Context = Annotated[ApiContext, Depends(get_deps)]
