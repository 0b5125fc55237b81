"""The HTTP API's dependencies built from real stores over PostgreSQL, without a node: no
RabbitMQ, no ZooKeeper; readiness, counts and the cluster view are plain callables a test sets."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime

from dispatcher.api.context import ApiContext
from dispatcher.auth.keyring import Keyring
from dispatcher.cluster.ownership import SingleNode
from dispatcher.flow.rules import RuleBook
from dispatcher.intake.service import Intake
from dispatcher.metrics import Metrics
from dispatcher.models import DueEntry
from dispatcher.settings import Settings
from dispatcher.store.api_keys import KeyStore
from dispatcher.store.bulk_actions import BulkActionStore
from dispatcher.store.db import Database
from dispatcher.store.flow_rules import FlowRuleStore
from dispatcher.store.history import HistoryStore
from dispatcher.store.jobs import JobStore
from dispatcher.store.schedules import ScheduleStore
from dispatcher.store.shards import ShardStore
from dispatcher.upkeep import housekeeping, vacuum_horizon

ADMIN = "admin-token-0123456789"
MONITOR = "monitor-token-0123456789"
SHARDS = 4
CLUSTER = {"mode": "test", "members": ["only"]}
HEAP_SIZE = 7


class Checks:
    """Readiness as the routes see it: named checks and the failing loops, set by the test."""

    def __init__(self) -> None:
        self.checks = {"postgres": True, "rabbitmq": True}
        self.failing: dict[str, str] = {}
        self.clock: dict[str, object] = {
            "trusted": True,
            "offset_s": 0.0,
            "error_s": 0.0005,
            "max_offset_s": 1.0,
            "steps": 0,
        }
        self.standing: dict[str, object] = {
            "standing": "ok",
            "for_s": 12.5,
            "step_out_s": 10.0,
            "failing": {},
            "last_ok_s_ago": {"postgres": 0.4, "rabbitmq": 0.4, "clock": 0.1},
            "last_claim_s_ago": 0.2,
            "last_confirm_s_ago": 0.2,
        }
        self.vacuum = vacuum_horizon.Horizon(warn_after_s=600.0)

    def vacuum_state(self) -> dict[str, object]:
        return self.vacuum.describe()

    def clock_state(self) -> dict[str, object]:
        return dict(self.clock)

    def standing_state(self) -> dict[str, object]:
        return dict(self.standing)

    async def readiness(self) -> dict[str, bool]:
        return dict(self.checks)

    def degraded(self) -> dict[str, str]:
        return dict(self.failing)


class NoWindow:
    """No node loads a window here, so nothing is fired: the jobs intake offers are dropped."""

    def offer(self, entries: Iterable[DueEntry]) -> None:
        pass


async def describe() -> dict[str, object]:
    return dict(CLUSTER)


async def _nothing_to_refresh() -> None:
    pass


def build(database_url: str, db: Database, checks: Checks) -> ApiContext:
    settings = Settings(
        database_url=database_url, shard_count=SHARDS, api_keys=f"{ADMIN}:admin,{MONITOR}:monitor"
    )
    metrics = Metrics()
    store = JobStore(db, node_id="api-only", lease_s=settings.lease_s)
    ownership = SingleNode(ShardStore(db), node_id="api-only", shard_count=SHARDS)
    intake = Intake(
        store=store,
        window=NoWindow(),
        ownership=ownership,
        metrics=metrics,
        shard_count=SHARDS,
        lookahead_s=settings.lookahead_s,
        group_commit=False,  # no intake task runs the group commit here
        now=time.time,
    )
    keyring = Keyring(
        static=settings.static_keys(),
        store=KeyStore(db),
        cache_s=settings.api_key_cache_s,
        required=settings.api_auth_required,
    )
    return ApiContext(
        settings=settings,
        intake=intake,
        jobs=store,
        history=HistoryStore(db),
        schedules=ScheduleStore(db),
        keyring=keyring,
        metrics=metrics,
        now_dt=lambda: datetime.now(UTC),
        readiness=checks.readiness,
        degraded=checks.degraded,
        clock=checks.clock_state,
        standing=checks.standing_state,
        publish_path=lambda: {"path": "per_message", "fallback_reason": "forced"},
        counts=housekeeping.Snapshot,
        heap_size=lambda: HEAP_SIZE,
        cluster=describe,
        vacuum=checks.vacuum_state,
        flow_rules=FlowRuleStore(
            db,
            max_rules=settings.max_flow_rules,
            max_rules_per_namespace=settings.max_flow_rules_per_namespace,
        ),
        rules=RuleBook,
        rules_changed=_nothing_to_refresh,
        bulk_actions=BulkActionStore(db),
        bulk_started=lambda: None,
    )
