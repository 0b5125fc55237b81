"""The HTTP API built from its dependencies alone: no Node, no RabbitMQ, no ZooKeeper; the job,
history, schedule and key stores over a real PostgreSQL, and readiness, counts and the cluster view
given as plain callables."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import httpx
import pytest

from dispatcher.api import app, ops
from dispatcher.api.context import ApiContext
from dispatcher.store.db import Database
from tests.support import api_context
from tests.support.nodes import WRITE, jobs_stored

ADMIN = api_context.ADMIN
MONITOR = api_context.MONITOR
HEAP_SIZE = api_context.HEAP_SIZE
CLUSTER = api_context.CLUSTER
Checks = api_context.Checks


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", **WRITE}


@pytest.fixture
def checks() -> Checks:
    return Checks()


@pytest.fixture
def context(database_url: str, db: Database, checks: Checks) -> ApiContext:
    return api_context.build(database_url, db, checks)


@pytest.fixture
async def http(context: ApiContext) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app.create_api(context))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client


async def test_jobs_are_created_and_read_back_through_an_api_built_without_a_node(
    http: httpx.AsyncClient, database_url: str
) -> None:
    created = await http.post(
        "/v1/jobs",
        json={"routing_key": "context.work", "payload": {"n": 1}, "delay_ms": 600_000},
        headers=bearer(ADMIN),
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    found = await http.get(f"/v1/jobs/{job_id}", headers=bearer(ADMIN))
    assert found.status_code == 200, found.text
    assert found.json()["state"] == "scheduled"
    assert found.json()["routing_key"] == "context.work"
    assert await jobs_stored(database_url) == 1


async def test_the_gate_of_an_api_built_without_a_node_asks_its_keyring(
    http: httpx.AsyncClient, database_url: str
) -> None:
    job = {"routing_key": "context.work", "payload": 1, "delay_ms": 600_000}
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


async def test_readyz_shows_the_standing_and_names_its_reason_while_it_is_not_ok(
    http: httpx.AsyncClient, checks: Checks
) -> None:
    ready = await http.get("/readyz", headers=bearer(ADMIN))
    checks.checks["standing"] = False
    reason = (
        "stepped out: its shards go to any node well enough to fire: postgres failing for 10.2 s"
    )
    checks.standing = {
        **checks.standing,
        "standing": "out",
        "failing": {"postgres": {"for_s": 10.2, "reason": "timeout"}},
        "reason": reason,
    }
    out = await http.get("/readyz", headers=bearer(ADMIN))
    assert ready.json()["standing"]["standing"] == "ok"
    assert ready.json()["standing"]["last_confirm_s_ago"] == 0.2
    assert out.status_code == 503, out.text
    assert out.json()["standing"]["failing"] == {"postgres": {"for_s": 10.2, "reason": "timeout"}}
    assert out.json()["degraded"] == {"standing": reason}


async def test_readyz_tells_other_keys_what_failed_but_not_the_drivers_text(
    http: httpx.AsyncClient, checks: Checks
) -> None:
    probe = "PostgreSQL unavailable: OSError(\"Connect call failed ('10.1.2.3', 5432)\")"
    loop = 'UndefinedTableError: relation "jobs" does not exist (SELECT id FROM jobs WHERE ...)'
    checks.checks["postgres"] = False
    checks.failing["loader"] = loop
    checks.clock = {**checks.clock, "trusted": False, "reason": "db.internal:5432 unanswered"}
    checks.standing = {
        **checks.standing,
        "standing": "failing",
        "failing": {"postgres": {"for_s": 2.5, "reason": probe}},
        "reason": f"postgres failing for 2.5 s: {probe}",
    }
    admin = (await http.get("/readyz", headers=bearer(ADMIN))).json()
    monitor = await http.get("/readyz", headers=bearer(MONITOR))
    assert monitor.status_code == 503
    shown = monitor.json()
    for text in ("10.1.2.3", "5432", "Connect", "SELECT", "jobs", "db.internal", "forced"):
        assert text not in monitor.text, text
    assert shown["checks"] == admin["checks"]  # which check failed is not withheld
    assert shown["degraded"] == {
        "loader": ops.WITHHELD,
        "clock": ops.WITHHELD,
        "standing": ops.WITHHELD,
    }
    assert shown["standing"]["standing"] == "failing"
    assert shown["standing"]["failing"] == {"postgres": {"for_s": 2.5, "reason": ops.WITHHELD}}
    assert shown["standing"]["reason"] == ops.WITHHELD
    assert (shown["clock"]["trusted"], shown["clock"]["reason"]) == (False, ops.WITHHELD)
    assert shown["publish_path"] == {"path": "per_message", "fallback_reason": ops.WITHHELD}
    # An admin key gets the node's own words.
    assert admin["degraded"]["loader"] == loop
    assert admin["standing"]["failing"]["postgres"]["reason"] == probe
    assert admin["clock"]["reason"] == "db.internal:5432 unanswered"


async def test_stats_and_cluster_come_from_the_callables_given(http: httpx.AsyncClient) -> None:
    scheduled = await http.post(
        "/v1/jobs",
        json={"routing_key": "context.soon", "payload": 1, "delay_ms": 1_000},
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
        ("context.a", minute + timedelta(seconds=5)),
        ("context.a", minute + timedelta(seconds=30)),
        ("context.a", minute + timedelta(seconds=59)),
        ("context.b", minute + timedelta(seconds=10)),
        ("context.a", minute + timedelta(minutes=1, seconds=1)),
        ("context.a", minute + timedelta(minutes=1, seconds=2)),
        ("context.a", minute + timedelta(hours=3)),  # beyond the window
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
        (minute, "context.a", 3),
        (minute, "context.b", 1),
        (minute + timedelta(minutes=1), "context.a", 2),
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
