"""Operators' and tenants' flow rules on a real node, PostgreSQL and RabbitMQ: a tenant's limits
key can neither change an operator's rule nor release what it holds with a longer rule of its
own; each namespace's limits keys and the operators have a cap of their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from devstack.collector import Collector
from dispatcher.node import Node
from tests.integration.test_limits_api import rule_rows
from tests.support.nodes import bearer, client, running_node

ADMIN = "admin-token-0123456789"
A_LIMITS = "limits-a-token-0123456789"
B_LIMITS = "limits-b-token-0123456789"
A_PRODUCER = "producer-a-token-0123456789"
CAP = 3  # each namespace's
NODE = {
    "node_id": "owners",
    "shard_count": 8,
    "api_keys": ",".join(
        [
            f"{ADMIN}:admin",
            f"{A_LIMITS}:limits:a:billing.|payments.",
            f"{B_LIMITS}:limits:b",
            f"{A_PRODUCER}:producer:a",
        ]
    ),
    "max_flow_rules": CAP + 1,
    "max_flow_rules_per_namespace": CAP,
}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(database_url=database_url, amqp_url=amqp_url, **NODE) as running:
        yield running


async def owners(node: Node) -> list[tuple[str, str | None, str]]:
    """Every rule's key, namespace and owner, as an admin lists them."""
    async with client(node) as http:
        listed = (await http.get("/v1/limits", headers=bearer(ADMIN))).json()["limits"]
    return [(rule["key"], rule["namespace"], rule["owner"]) for rule in listed]


async def test_a_tenants_rate_below_an_operators_pause_lets_nothing_go_until_resumed(
    node: Node, database_url: str, collector: Collector
) -> None:
    async with client(node) as http:
        paused = await http.post(
            "/v1/limits/billing/pause", json={"note": "downstream down"}, headers=bearer(ADMIN)
        )
        assert paused.status_code == 200, paused.text
        assert paused.json()["owner"] == "operator"
        # The tenant's longer key is its own rule: allowed, and it can hold more, not release.
        rated = await http.put(
            "/v1/limits/billing.invoice", json={"rate_per_s": 100}, headers=bearer(A_LIMITS)
        )
        assert rated.status_code == 200, rated.text
        assert (rated.json()["namespace"], rated.json()["owner"]) == ("a", "tenant")
        job = await http.post(
            "/v1/jobs",
            json={"routing_key": "billing.invoice", "payload": 1},
            headers=bearer(A_PRODUCER),
        )
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        shown = await http.get(f"/v1/jobs/{job_id}", headers=bearer(A_PRODUCER))
        assert shown.json()["held_by"]["key"] == "billing"  # the operator's pause holds it
        await asyncio.sleep(3.0)  # the tenant's meter ticks every 50 ms meanwhile
        assert job_id not in collector.deliveries
        resumed = await http.post("/v1/limits/billing/resume", headers=bearer(ADMIN))
        assert resumed.status_code == 200, resumed.text
        # Now the tenant's rate governs its key, and lets the job go.
        assert await collector.wait_for([job_id], 20) == set()
    assert await rule_rows(database_url) == [("billing.invoice", "a", False)]
    assert await owners(node) == [("billing.invoice", "a", "tenant")]


async def test_a_tenant_may_not_change_pause_resume_or_delete_an_operators_rule(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        made = await http.post(
            "/v1/limits/payments/pause", params={"namespace": "a"}, json={}, headers=bearer(ADMIN)
        )
        assert made.status_code == 200, made.text
        tries = [
            ("PUT", "/v1/limits/payments", {"rate_per_s": 5}),
            ("POST", "/v1/limits/payments/pause", {"note": "mine now"}),
            ("POST", "/v1/limits/payments/resume", None),
            ("DELETE", "/v1/limits/payments", None),
        ]
        for method, path, body in tries:
            refused = await http.request(method, path, json=body, headers=bearer(A_LIMITS))
            assert refused.status_code == 403, (method, path, refused.text)
            assert refused.json()["fields"][0]["field"] == "key"
            assert "operator" in refused.json()["fields"][0]["message"]
        # It still sees the rule, and whose it is.
        seen = (await http.get("/v1/limits", headers=bearer(A_LIMITS))).json()["limits"]
        assert [(rule["key"], rule["owner"]) for rule in seen] == [("payments", "operator")]
        # An admin changes a tenant's rule, which is then the operator's.
        await http.post("/v1/limits/billing/pause", json={}, headers=bearer(A_LIMITS))
        taken = await http.put(
            "/v1/limits/billing",
            params={"namespace": "a"},
            json={"rate_per_s": 1},
            headers=bearer(ADMIN),
        )
        assert taken.json()["owner"] == "operator"
        refused = await http.delete("/v1/limits/billing", headers=bearer(A_LIMITS))
        assert refused.status_code == 403
    assert await rule_rows(database_url) == [("billing", "a", False), ("payments", "a", True)]
    assert await owners(node) == [("billing", "a", "operator"), ("payments", "a", "operator")]


async def test_a_namespace_at_its_cap_leaves_other_namespaces_and_the_admin_their_own(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        for n in range(CAP):
            made = await http.post(
                f"/v1/limits/billing.k{n}/pause", json={}, headers=bearer(A_LIMITS)
            )
            assert made.status_code == 200, made.text
        refused = await http.post(
            "/v1/limits/billing.more/pause", json={}, headers=bearer(A_LIMITS)
        )
        assert refused.status_code == 409, refused.text
        assert refused.json()["fields"][0]["field"] == "key"
        assert "DISPATCHER_MAX_FLOW_RULES_PER_NAMESPACE" in refused.text
        assert "'a'" in refused.text
        # A change of one of its own rules is no new rule: allowed at the cap.
        changed = await http.put(
            "/v1/limits/billing.k0", json={"rate_per_s": 5}, headers=bearer(A_LIMITS)
        )
        assert changed.status_code == 200, changed.text
        for n in range(CAP):
            other = await http.post(f"/v1/limits/mail{n}/pause", json={}, headers=bearer(B_LIMITS))
            assert other.status_code == 200, other.text
        for n in range(CAP + 1):
            admin = await http.post(f"/v1/limits/ops{n}/pause", json={}, headers=bearer(ADMIN))
            assert admin.status_code == 200, admin.text
        beyond = await http.post("/v1/limits/ops-more/pause", json={}, headers=bearer(ADMIN))
        assert beyond.status_code == 409
        assert beyond.json()["message"].startswith("operators hold 4 flow rules")
        assert "DISPATCHER_MAX_FLOW_RULES allows" in beyond.json()["message"]
    held = [(namespace, owner) for _, namespace, owner in await owners(node)]
    assert held.count(("a", "tenant")) == CAP
    assert held.count(("b", "tenant")) == CAP
    assert held.count((None, "operator")) == CAP + 1
    assert len(await rule_rows(database_url)) == 3 * CAP + 1
