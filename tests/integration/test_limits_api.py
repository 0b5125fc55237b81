"""/v1/limits against an in-process node and a real PostgreSQL: pause, resume, set and delete a
rule; a metered rule's fields, its defaults, and its meter kept through a pause and a resume;
refused input named and changing nothing; who may manage which rules; the cap; a held job shown
with the rule holding it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
import pytest_asyncio

from consumers_sdk.client import DispatcherClient
from consumers_sdk.errors import AccessDenied, FlowRuleNotFound, InvalidFlowRule
from dispatcher.node import Node
from tests.support.nodes import ON_THE_MODULES_NODE, client, running_node

ADMIN = "admin-token-0123456789"
SHOP = "limits-shop-token-0123456789"
SHOP_BILLING = "limits-shop-billing-token-01"
PRODUCER = "producer-shop-token-0123456789"
MONITOR = "monitor-token-0123456789"
NODE = {
    "node_id": "limits",
    "shard_count": 8,
    "api_keys": ",".join(
        [
            f"{ADMIN}:admin",
            f"{SHOP}:limits:shop",
            f"{SHOP_BILLING}:limits:shop:billing.",
            f"{PRODUCER}:producer:shop",
            f"{MONITOR}:monitor",
        ]
    ),
    "max_flow_rules": 3,
}


METER = ("rate_per_s", "burst", "max_in_flight", "in_flight_timeout_s")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(database_url=database_url, amqp_url=amqp_url, **NODE) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def refusing_node(module_database_url: str, module_amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=module_database_url, amqp_url=module_amqp_url, **NODE
    ) as running:
        yield running


async def rule_rows(database_url: str) -> list[tuple[str, str | None, bool]]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT key, namespace, paused FROM flow_rules ORDER BY 1, 2")
    finally:
        await connection.close()
    return [(row["key"], row["namespace"], row["paused"]) for row in rows]


async def test_pause_list_get_and_resume_a_key(node: Node, database_url: str) -> None:
    async with client(node) as http:
        paused = await http.post(
            "/v1/limits/billing./pause", json={"note": "payments down"}, headers=bearer(ADMIN)
        )
        assert paused.status_code == 200, paused.text
        rule = paused.json()
        assert rule["key"] == "billing"  # the trailing dot names the same words
        assert rule["namespace"] is None  # every namespace
        assert rule["paused"] is True
        assert rule["holding"] is True
        assert rule["note"] == "payments down"
        listed = (await http.get("/v1/limits", headers=bearer(ADMIN))).json()["limits"]
        assert [(item["key"], item["namespace"]) for item in listed] == [("billing", None)]
        got = await http.get("/v1/limits/billing", headers=bearer(ADMIN))
        assert got.json()["paused"] is True
        assert await rule_rows(database_url) == [("billing", None, True)]
        resumed = await http.post("/v1/limits/billing/resume", headers=bearer(ADMIN))
        assert resumed.status_code == 200, resumed.text
        assert await rule_rows(database_url) == []
        missing = await http.post("/v1/limits/billing/resume", headers=bearer(ADMIN))
        assert missing.status_code == 404
        assert (await http.get("/v1/limits/billing", headers=bearer(ADMIN))).status_code == 404


async def test_put_replaces_and_delete_answers_the_rule_removed(
    node: Node, database_url: str
) -> None:
    until = datetime.now(UTC) + timedelta(hours=1)
    async with client(node) as http:
        put = await http.put(
            "/v1/limits/orders",
            params={"namespace": ""},
            json={"paused": True, "paused_until": until.isoformat()},
            headers=bearer(ADMIN),
        )
        assert put.status_code == 200, put.text
        assert put.json()["namespace"] == ""
        assert datetime.fromisoformat(put.json()["paused_until"]) == until
        again = await http.put(
            "/v1/limits/orders",
            params={"namespace": ""},
            json={"paused": True},
            headers=bearer(ADMIN),
        )
        assert again.json()["paused_until"] is None
        assert await rule_rows(database_url) == [("orders", "", True)]
        deleted = await http.delete(
            "/v1/limits/orders", params={"namespace": ""}, headers=bearer(ADMIN)
        )
        assert deleted.status_code == 200
        assert deleted.json()["key"] == "orders"
    assert await rule_rows(database_url) == []


async def test_a_limits_key_manages_its_own_namespace_within_its_prefixes(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        own = await http.post("/v1/limits/mail/pause", json={}, headers=bearer(SHOP))
        assert own.status_code == 200, own.text
        assert own.json()["namespace"] == "shop"
        other = await http.post(
            "/v1/limits/mail/pause", params={"namespace": "other"}, json={}, headers=bearer(SHOP)
        )
        assert other.status_code == 403
        assert other.json()["fields"][0]["field"] == "namespace"
        outside = await http.post("/v1/limits/mail/pause", json={}, headers=bearer(SHOP_BILLING))
        assert outside.status_code == 403
        assert outside.json()["fields"][0]["field"] == "key"
        inside = await http.post(
            "/v1/limits/billing.card/pause", json={}, headers=bearer(SHOP_BILLING)
        )
        assert inside.status_code == 200, inside.text
        seen = (await http.get("/v1/limits", headers=bearer(SHOP_BILLING))).json()["limits"]
        assert [item["key"] for item in seen] == ["billing.card"]
        for token in (PRODUCER, MONITOR):
            refused = await http.post("/v1/limits/mail/pause", json={}, headers=bearer(token))
            assert refused.status_code == 403
            assert (await http.get("/v1/limits", headers=bearer(token))).status_code == 403
        assert (await http.get("/v1/limits")).status_code == 401
    assert await rule_rows(database_url) == [("billing.card", "shop", True), ("mail", "shop", True)]


async def test_past_the_cap_a_new_rule_is_refused_and_a_change_is_not(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        for key in ("a", "b", "c"):
            made = await http.post(f"/v1/limits/{key}/pause", json={}, headers=bearer(ADMIN))
            assert made.status_code == 200, made.text
        refused = await http.post("/v1/limits/d/pause", json={}, headers=bearer(ADMIN))
        assert refused.status_code == 409
        assert refused.json()["fields"][0]["field"] == "key"
        changed = await http.post(
            "/v1/limits/a/pause", json={"note": "still"}, headers=bearer(ADMIN)
        )
        assert changed.status_code == 200
    assert [key for key, _, _ in await rule_rows(database_url)] == ["a", "b", "c"]


@ON_THE_MODULES_NODE
@pytest.mark.parametrize(
    ("method", "path", "params", "body", "field"),
    [
        ("put", "/v1/limits/billing", {}, {"paused": False}, "paused"),
        ("put", "/v1/limits/billing", {}, {"paused": True, "rate": 5}, "rate"),
        ("put", "/v1/limits/billing", {}, {}, "paused"),
        ("put", "/v1/limits/billing", {}, {"paused": "yes"}, "paused"),
        ("put", "/v1/limits/billing", {}, {"rate_per_s": 0}, "rate_per_s"),
        ("put", "/v1/limits/billing", {}, {"rate_per_s": -1}, "rate_per_s"),
        ("put", "/v1/limits/billing", {}, {"rate_per_s": 100_001}, "rate_per_s"),
        ("put", "/v1/limits/billing", {}, {"rate_per_s": "5"}, "rate_per_s"),
        ("put", "/v1/limits/billing", {}, {"rate_per_s": True}, "rate_per_s"),
        ("put", "/v1/limits/billing", {}, {"paused": True, "burst": 5}, "burst"),
        ("put", "/v1/limits/billing", {}, {"rate_per_s": 5, "burst": 0}, "burst"),
        ("put", "/v1/limits/billing", {}, {"rate_per_s": 5, "burst": 2.5}, "burst"),
        ("put", "/v1/limits/billing", {}, {"max_in_flight": 0}, "max_in_flight"),
        ("put", "/v1/limits/billing", {}, {"max_in_flight": "9"}, "max_in_flight"),
        (
            "put",
            "/v1/limits/billing",
            {},
            {"paused": True, "in_flight_timeout_s": 60},
            "in_flight_timeout_s",
        ),
        (
            "put",
            "/v1/limits/billing",
            {},
            {"max_in_flight": 5, "in_flight_timeout_s": 0},
            "in_flight_timeout_s",
        ),
        (
            "put",
            "/v1/limits/billing",
            {},
            {"max_in_flight": 5, "in_flight_timeout_s": 604_801},
            "in_flight_timeout_s",
        ),
        ("put", "/v1/limits/billing", {}, {"rate_per_s": 5, "max_rate": 9}, "max_rate"),
        (
            "put",
            "/v1/limits/billing",
            {},
            {"paused": True, "paused_until": "2020-01-01T00:00:00Z"},
            "paused_until",
        ),
        (
            "put",
            "/v1/limits/billing",
            {},
            {"paused": True, "paused_until": "2030-01-01T00:00:00"},
            "paused_until",
        ),
        ("post", "/v1/limits/billing/pause", {}, {"until": "2000-01-01T00:00:00Z"}, "until"),
        ("post", "/v1/limits/billing/pause", {}, {"note": "x" * 501}, "note"),
        ("post", "/v1/limits/billing/pause", {}, {"after": 5}, "after"),
        ("post", "/v1/limits/bill..ing/pause", {}, {}, "key"),
        ("post", "/v1/limits/bill%20ing/pause", {}, {}, "key"),
        ("post", "/v1/limits/billing/pause", {"namespace": "a b"}, {}, "namespace"),
        ("post", "/v1/limits/" + "a" * 300 + "/pause", {}, {}, "key"),
    ],
)
async def test_refused_input_names_the_field_and_changes_nothing(
    refusing_node: Node,
    module_database_url: str,
    method: str,
    path: str,
    params: dict[str, str],
    body: dict[str, object],
    field: str,
) -> None:
    async with client(refusing_node) as http:
        answer = await http.request(
            method.upper(), path, params=params, json=body, headers=bearer(ADMIN)
        )
    assert answer.status_code == 422, answer.text
    assert field in [item["field"] for item in answer.json()["fields"]], answer.text
    assert await rule_rows(module_database_url) == []


async def test_put_answers_a_metered_rule_with_its_defaults_filled(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        put = await http.put(
            "/v1/limits/billing",
            json={"rate_per_s": 200, "max_in_flight": 50, "note": "card processor"},
            headers=bearer(ADMIN),
        )
        assert put.status_code == 200, put.text
        rule = put.json()
        assert {name: rule[name] for name in METER} == {
            "rate_per_s": 200,
            "burst": 20,  # a tenth of a second's worth
            "max_in_flight": 50,
            "in_flight_timeout_s": 300,
        }
        assert (rule["paused"], rule["holding"], rule["metering"]) == (False, False, True)
        got = (await http.get("/v1/limits/billing", headers=bearer(ADMIN))).json()
        assert got == rule
        slow = await http.put(
            "/v1/limits/slow",
            json={"rate_per_s": 0.5, "burst": 3, "paused": True},
            headers=bearer(ADMIN),
        )
        assert slow.status_code == 200, slow.text
        assert {name: slow.json()[name] for name in METER} == {
            "rate_per_s": 0.5,
            "burst": 3,
            "max_in_flight": None,
            "in_flight_timeout_s": None,
        }
        assert (slow.json()["holding"], slow.json()["metering"]) == (True, False)
        listed = (await http.get("/v1/limits", headers=bearer(ADMIN))).json()["limits"]
        assert [(r["key"], r["metering"]) for r in listed] == [("billing", True), ("slow", False)]
    assert await rule_rows(database_url) == [("billing", None, False), ("slow", None, True)]


async def test_a_refused_put_leaves_the_rule_as_it_was(node: Node) -> None:
    async with client(node) as http:
        for body in ({"rate_per_s": -1}, {"burst": 5}, {"rate_per_s": "fast"}):
            refused = await http.put("/v1/limits/billing", json=body, headers=bearer(ADMIN))
            assert refused.status_code == 422, refused.text
            missing = await http.get("/v1/limits/billing", headers=bearer(ADMIN))
            assert missing.status_code == 404
        made = await http.put("/v1/limits/billing", json={"rate_per_s": 10}, headers=bearer(ADMIN))
        assert made.status_code == 200, made.text
        for body in ({"rate_per_s": 0}, {"max_in_flight": 0}, {"in_flight_timeout_s": 5}):
            refused = await http.put("/v1/limits/billing", json=body, headers=bearer(ADMIN))
            assert refused.status_code == 422, refused.text
            got = await http.get("/v1/limits/billing", headers=bearer(ADMIN))
            assert got.json() == made.json()


async def test_a_pause_keeps_the_meter_and_a_resume_leaves_it_metering(
    node: Node, database_url: str
) -> None:
    meter = {"rate_per_s": 50, "burst": 7, "max_in_flight": 4, "in_flight_timeout_s": 30}
    async with client(node) as http:
        put = await http.put(
            "/v1/limits/billing", json={**meter, "note": "slow api"}, headers=bearer(ADMIN)
        )
        assert put.status_code == 200, put.text
        until = datetime.now(UTC) + timedelta(hours=1)
        paused = await http.post(
            "/v1/limits/billing/pause",
            json={"until": until.isoformat(), "note": "incident"},
            headers=bearer(ADMIN),
        )
        assert paused.status_code == 200, paused.text
        rule = paused.json()
        assert {name: rule[name] for name in METER} == meter
        assert (rule["paused"], rule["holding"], rule["metering"]) == (True, True, False)
        assert (rule["note"], datetime.fromisoformat(rule["paused_until"])) == ("incident", until)

        resumed = await http.post("/v1/limits/billing/resume", headers=bearer(ADMIN))
        assert resumed.status_code == 200, resumed.text
        rule = resumed.json()  # the rule as it is now: still there, metering
        assert {name: rule[name] for name in METER} == meter
        assert (rule["paused"], rule["paused_until"], rule["note"]) == (False, None, "incident")
        assert (rule["holding"], rule["metering"]) == (False, True)
        assert await rule_rows(database_url) == [("billing", None, False)]
        got = (await http.get("/v1/limits/billing", headers=bearer(ADMIN))).json()
        assert got == rule
        # A pause-only rule is deleted by its resume, as before.
        await http.post("/v1/limits/mail/pause", json={}, headers=bearer(ADMIN))
        gone = await http.post("/v1/limits/mail/resume", headers=bearer(ADMIN))
        assert (gone.status_code, gone.json()["paused"]) == (200, True)  # as it was
        assert (await http.get("/v1/limits/mail", headers=bearer(ADMIN))).status_code == 404
    assert await rule_rows(database_url) == [("billing", None, False)]


async def test_a_held_job_shows_the_rule_holding_it(node: Node) -> None:
    async with client(node) as http:
        await http.post(
            "/v1/limits/billing/pause", json={"note": "card processor down"}, headers=bearer(ADMIN)
        )
        job = await http.post(
            "/v1/jobs",
            json={"routing_key": "billing.charge", "payload": 1, "delay_ms": 60_000},
            headers=bearer(PRODUCER),
        )
        other = await http.post(
            "/v1/jobs",
            json={"routing_key": "mail.send", "payload": 1, "delay_ms": 60_000},
            headers=bearer(PRODUCER),
        )
        held = (await http.get(f"/v1/jobs/{job.json()['id']}", headers=bearer(PRODUCER))).json()
        assert held["held_by"] == {
            "key": "billing",
            "namespace": None,
            "paused": True,
            "paused_until": None,
            "metered": False,
            "note": "card processor down",
        }
        free = (await http.get(f"/v1/jobs/{other.json()['id']}", headers=bearer(PRODUCER))).json()
        assert free["held_by"] is None
        page = (await http.get("/v1/jobs", headers=bearer(PRODUCER))).json()["jobs"]
        assert {item["routing_key"]: item["held_by"] is not None for item in page} == {
            "billing.charge": True,
            "mail.send": False,
        }
        # Held, it can still be cancelled.
        cancelled = await http.delete(f"/v1/jobs/{job.json()['id']}", headers=bearer(PRODUCER))
        assert cancelled.json()["state"] == "cancelled"
        assert cancelled.json()["held_by"] is None


async def test_the_client_pauses_lists_and_resumes_a_key(node: Node) -> None:
    transport = httpx.ASGITransport(app=node.serving.app)
    async with DispatcherClient("http://127.0.0.1", api_key=SHOP, transport=transport) as shop:
        until = datetime.now(UTC) + timedelta(hours=2)
        paused = await shop.limits.pause("mail", until=until, note="smtp relay down")
        assert (paused.key, paused.namespace, paused.holding) == ("mail", "shop", True)
        assert paused.paused_until == until
        assert [rule.key for rule in await shop.limits.list()] == ["mail"]
        assert (await shop.limits.get("mail")).note == "smtp relay down"
        with pytest.raises(InvalidFlowRule) as refused:
            await shop.limits.pause("mail..x")
        assert refused.value.body["fields"][0]["field"] == "key"
        with pytest.raises(AccessDenied):
            await shop.limits.pause("mail", namespace="other")
        resumed = await shop.limits.resume("mail")
        assert resumed.key == "mail"
        with pytest.raises(FlowRuleNotFound):
            await shop.limits.resume("mail")
        assert await shop.limits.list() == ()
    async with DispatcherClient("http://127.0.0.1", api_key=ADMIN, transport=transport) as admin:
        await admin.limits.pause("billing", note="held")
        job = await admin.schedule("billing.charge", 1, delay=60)
        held = await admin.get(job.id)
        assert held.held_by is not None
        assert (held.held_by.key, held.held_by.note) == ("billing", "held")
        await admin.limits.delete("billing")
        assert (await admin.get(job.id)).held_by is None


async def test_the_client_sets_a_metered_rule(node: Node) -> None:
    transport = httpx.ASGITransport(app=node.serving.app)
    async with DispatcherClient("http://127.0.0.1", api_key=SHOP, transport=transport) as shop:
        metered = await shop.limits.set(
            "mail", rate_per_s=5, max_in_flight=2, in_flight_timeout_s=timedelta(minutes=1)
        )
        assert (metered.key, metered.namespace, metered.paused) == ("mail", "shop", False)
        assert (metered.rate_per_s, metered.burst) == (5, 1)
        assert (metered.max_in_flight, metered.in_flight_timeout_s) == (2, 60)
        assert (metered.holding, metered.metering) == (False, True)
        until = datetime.now(UTC) + timedelta(hours=1)
        paused = await shop.limits.set("mail", paused=True, paused_until=until, note="smtp")
        assert (paused.rate_per_s, paused.max_in_flight, paused.metering) == (None, None, False)
        assert (paused.holding, paused.paused_until, paused.note) == (True, until, "smtp")
        with pytest.raises(InvalidFlowRule) as refused:
            await shop.limits.set("mail", burst=3)
        assert refused.value.body["fields"][0]["field"] == "burst"
        with pytest.raises(InvalidFlowRule) as refused:
            await shop.limits.set("mail")  # holds nothing
        assert refused.value.body["fields"][0]["field"] == "paused"
        assert (await shop.limits.get("mail")).note == "smtp"
