"""The HTTP API built from its dependencies alone: no Node, no RabbitMQ, no ZooKeeper; the job,
history, schedule and key stores over a real PostgreSQL, and readiness, counts and the cluster view
given as plain callables."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import httpx
import pytest

from dispatcher import api, housekeeping
from dispatcher.api.deps import ApiDeps
from dispatcher.cluster.ownership import SingleNode
from dispatcher.firing.heap import Backlog, DueHeap
from dispatcher.firing.loader import Loader
from dispatcher.intake import Intake
from dispatcher.keyring import Keyring
from dispatcher.metrics import Metrics
from dispatcher.settings import Settings
from dispatcher.store.api_keys import KeyStore
from dispatcher.store.db import Database
from dispatcher.store.history import HistoryStore
from dispatcher.store.jobs import JobStore
from dispatcher.store.schedules import ScheduleStore
from dispatcher.store.shards import ShardStore
from tests.support.nodes import WRITE, jobs_stored

ADMIN = "admin-token-0123456789"
SHARDS = 4
CLUSTER = {"mode": "test", "members": ["only"]}
HEAP_SIZE = 7


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **WRITE}


class Checks:
    """Readiness as the routes see it: named checks and the failing loops, set by the test."""

    def __init__(self) -> None:
        self.checks = {"postgres": True, "rabbitmq": True}
        self.failing: dict[str, str] = {}

    async def readiness(self) -> dict[str, bool]:
        return dict(self.checks)

    def degraded(self) -> dict[str, str]:
        return dict(self.failing)


async def describe() -> dict[str, object]:
    return dict(CLUSTER)


@pytest.fixture
def checks() -> Checks:
    return Checks()


@pytest.fixture
def deps(database_url: str, db: Database, checks: Checks) -> ApiDeps:
    settings = Settings(database_url=database_url, shard_count=SHARDS, api_keys=f"{ADMIN}:admin")
    metrics = Metrics()
    store = JobStore(db, node_id="api-only", lease_s=settings.lease_s)
    loader = Loader(
        store,
        DueHeap(),
        Backlog(),
        lookahead_s=settings.lookahead_s,
        heap_cap=settings.heap_cap,
        load_batch=settings.load_batch,
        lease_sweep_s=5.0,
        sweep_grace_s=settings.sweep_grace_s,
        clock=time.time,
        on_due=lambda: None,
    )
    ownership = SingleNode(ShardStore(db), node_id="api-only", shard_count=SHARDS)
    intake = Intake(
        store=store,
        loader=loader,
        ownership=ownership,
        metrics=metrics,
        shard_count=SHARDS,
        lookahead_s=settings.lookahead_s,
        group_commit=False,  # no intake task runs the group commit here
    )
    keyring = Keyring(
        static=settings.static_keys(),
        store=KeyStore(db),
        cache_s=settings.api_key_cache_s,
        required=settings.api_auth_required,
        lookup_rate=settings.api_key_lookup_rate,
    )
    return ApiDeps(
        settings=settings,
        intake=intake,
        jobs=store,
        history=HistoryStore(db),
        schedules=ScheduleStore(db),
        keyring=keyring,
        metrics=metrics,
        readiness=checks.readiness,
        degraded=checks.degraded,
        publish_path=lambda: {"path": "per_message", "fallback_reason": "forced"},
        counts=housekeeping.Snapshot,
        heap_size=lambda: HEAP_SIZE,
        cluster=describe,
    )


@pytest.fixture
async def http(deps: ApiDeps) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=api.create_api(deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


async def test_jobs_are_created_and_read_back_through_an_api_built_without_a_node(
    http: httpx.AsyncClient, database_url: str
) -> None:
    created = await http.post(
        "/v1/jobs",
        json={"routing_key": "deps.work", "payload": {"n": 1}, "delay_ms": 600_000},
        headers=bearer(ADMIN),
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    found = await http.get(f"/v1/jobs/{job_id}", headers=bearer(ADMIN))
    assert found.status_code == 200, found.text
    assert found.json()["state"] == "scheduled"
    assert found.json()["routing_key"] == "deps.work"
    assert await jobs_stored(database_url) == 1


async def test_the_gate_of_an_api_built_without_a_node_asks_its_keyring(
    http: httpx.AsyncClient, database_url: str
) -> None:
    job = {"routing_key": "deps.work", "payload": 1, "delay_ms": 600_000}
    refused = await http.post("/v1/jobs", json=job, headers=WRITE)
    wrong = await http.post("/v1/jobs", json=job, headers=bearer("not-a-known-token-0123"))
    assert refused.status_code == 401, refused.text
    assert wrong.status_code == 401, wrong.text
    assert await jobs_stored(database_url) == 0


async def test_readyz_answers_from_the_readiness_it_was_given(
    http: httpx.AsyncClient, checks: Checks
) -> None:
    ready = await http.get("/readyz", headers=bearer(ADMIN))
    checks.checks["rabbitmq"] = False
    checks.failing["loader"] = "RuntimeError: boom"
    not_ready = await http.get("/readyz", headers=bearer(ADMIN))
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"postgres": True, "rabbitmq": True}
    assert "degraded" not in ready.json()
    assert ready.json()["publish_path"] == {"path": "per_message", "fallback_reason": "forced"}
    assert not_ready.status_code == 503, not_ready.text
    assert not_ready.json()["checks"]["rabbitmq"] is False
    assert not_ready.json()["degraded"] == {"loader": "RuntimeError: boom"}


async def test_stats_and_cluster_come_from_the_callables_given(http: httpx.AsyncClient) -> None:
    scheduled = await http.post(
        "/v1/jobs",
        json={"routing_key": "deps.soon", "payload": 1, "delay_ms": 1_000},
        headers=bearer(ADMIN),
    )
    stats = await http.get("/v1/stats", headers=bearer(ADMIN))
    cluster = await http.get("/v1/cluster", headers=bearer(ADMIN))
    assert scheduled.status_code == 201, scheduled.text
    assert stats.status_code == 200, stats.text
    assert stats.json()["by_state"]["scheduled"] == 0  # no count taken yet: an empty snapshot
    assert [due["id"] for due in stats.json()["next_due"]] == [scheduled.json()["id"]]
    assert stats.json()["heap_size"] == HEAP_SIZE
    assert cluster.status_code == 200, cluster.text
    assert cluster.json() == CLUSTER


async def test_stats_count_the_next_jobs_due_per_minute_and_routing_key(
    http: httpx.AsyncClient,
) -> None:
    minute = (datetime.now(UTC) + timedelta(minutes=10)).replace(second=0, microsecond=0)
    plan = [
        ("deps.a", minute + timedelta(seconds=5)),
        ("deps.a", minute + timedelta(seconds=30)),
        ("deps.a", minute + timedelta(seconds=59)),
        ("deps.b", minute + timedelta(seconds=10)),
        ("deps.a", minute + timedelta(minutes=1, seconds=1)),
        ("deps.a", minute + timedelta(minutes=1, seconds=2)),
        ("deps.a", minute + timedelta(hours=3)),  # beyond the window
    ]
    for routing_key, run_at in plan:
        job = {"routing_key": routing_key, "payload": 1, "run_at": run_at.isoformat()}
        created = await http.post("/v1/jobs", json=job, headers=bearer(ADMIN))
        assert created.status_code == 201, created.text
    stats = await http.get("/v1/stats", headers=bearer(ADMIN))
    assert stats.status_code == 200, stats.text
    grouped = [
        (datetime.fromisoformat(group["minute"]), group["routing_key"], group["jobs"])
        for group in stats.json()["next_due_by_minute"]
    ]
    assert grouped == [
        (minute, "deps.a", 3),
        (minute, "deps.b", 1),
        (minute + timedelta(minutes=1), "deps.a", 2),
    ]
    assert len(stats.json()["next_due"]) == len(plan)  # the ungrouped list is still there


class Assets(HTMLParser):
    """The addresses a page loads: script sources and link targets, with the link's rel."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "script" and attributes.get("src"):
            self.found.append(("script", attributes["src"] or ""))
        if tag == "link" and attributes.get("href"):
            self.found.append((attributes.get("rel") or "", attributes["href"] or ""))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_api_docs_load_every_asset_from_the_node_itself(
    http: httpx.AsyncClient, page: str
) -> None:
    answer = await http.get(page)  # no key: the docs hold no data
    assert answer.status_code == 200, answer.text
    parser = Assets()
    parser.feed(answer.text)
    kinds = {kind for kind, _ in parser.found}
    assert "script" in kinds, answer.text
    if page == "/docs":
        assert "stylesheet" in kinds, answer.text
    for kind, address in parser.found:
        assert address.startswith("/"), address
        assert not address.startswith("//"), address  # same origin, not a protocol-relative CDN
        asset = await http.get(address)
        assert asset.status_code == 200, address
        expected = {"script": "javascript", "stylesheet": "text/css"}.get(kind, "image/")
        assert expected in asset.headers["content-type"], (address, asset.headers)
