"""GET /v1/jobs?routing_key_prefix= against an in-process node and a real PostgreSQL: the jobs of
those words or below only, LIKE's ``%`` and ``_`` never wildcards, a page's cursor, and a key's
namespace and routing-key grants still holding."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dispatcher.node import Node
from tests.support.nodes import bearer, client, running_node

ADMIN = "admin-token-0123456789"
TEAM_A = "team-a-token-0123456789"
TEAM_B = "team-b-token-0123456789"
CHARGES = "team-a-charges-token-0123"  # team-a, billing.charge and below only
API_KEYS = ",".join(
    [
        f"{ADMIN}:admin",
        f"{TEAM_A}:producer:team-a",
        f"{TEAM_B}:producer:team-b",
        f"{CHARGES}:producer:team-a:billing.charge",
    ]
)
# In creation order; ``bill_ng`` is what LIKE 'bill_ng%' would confuse with billing.
KEYS = [
    "billing",
    "billing.charge",
    "billingx.charge",
    "bill_ng.charge",
    "billing.refund.late",
    "other.billing",
    "billing.charge.retry",
]


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="prefix",
        shard_count=4,
        api_keys=API_KEYS,
    ) as running:
        yield running


async def submit(http: httpx.AsyncClient, token: str, keys: list[str]) -> None:
    for key in keys:
        job = {"routing_key": key, "payload": {"key": key}, "delay_ms": 600_000}
        response = await http.post("/v1/jobs", json=job, headers=bearer(token))
        assert response.status_code == 201, response.text


async def listed(http: httpx.AsyncClient, token: str = ADMIN, **params: Any) -> list[str]:
    response = await http.get("/v1/jobs", params=params, headers=bearer(token))
    assert response.status_code == 200, response.text
    return [job["routing_key"] for job in response.json()["jobs"]]


async def test_a_prefix_lists_its_words_and_below_in_creation_order(node: Node) -> None:
    async with client(node) as http:
        await submit(http, TEAM_A, KEYS)
        under_billing = ["billing", "billing.charge", "billing.refund.late", "billing.charge.retry"]
        assert await listed(http, routing_key_prefix="billing.") == under_billing
        assert await listed(http, routing_key_prefix="billing") == under_billing
        assert await listed(http, routing_key_prefix="billing.charge") == [
            "billing.charge",
            "billing.charge.retry",
        ]
        assert await listed(http, routing_key_prefix="bil") == []  # words, not letters
        # The state's branch (jobs_state) filters by the prefix too.
        assert await listed(http, routing_key_prefix="billing", state="scheduled") == under_billing
        assert await listed(http, routing_key_prefix="billing", state="dead") == []
        first = await http.get(
            "/v1/jobs", params={"routing_key_prefix": "billing", "limit": 3}, headers=bearer(ADMIN)
        )
        rest = await listed(http, routing_key_prefix="billing", after=first.json()["next_after"])
        assert [j["routing_key"] for j in first.json()["jobs"]] + rest == under_billing


async def test_an_underscore_is_itself_and_a_percent_is_refused(node: Node) -> None:
    async with client(node) as http:
        await submit(http, TEAM_A, KEYS)
        assert await listed(http, routing_key_prefix="bill_ng") == ["bill_ng.charge"]
        assert await listed(http, routing_key_prefix="bill_ng.") == ["bill_ng.charge"]
        for prefix in ("bill%", "%", "billing.*", ".billing", "a\x00", "b" * 256):
            response = await http.get(
                "/v1/jobs", params={"routing_key_prefix": prefix}, headers=bearer(ADMIN)
            )
            assert response.status_code == 422, (prefix, response.text)
            assert response.json()["fields"][0]["field"] == "routing_key_prefix"


async def test_a_prefix_and_a_routing_key_together_are_refused_naming_the_prefix(
    node: Node,
) -> None:
    async with client(node) as http:
        response = await http.get(
            "/v1/jobs",
            params={"routing_key": "billing.charge", "routing_key_prefix": "billing"},
            headers=bearer(ADMIN),
        )
    assert response.status_code == 422, response.text
    [field] = response.json()["fields"]
    assert field["field"] == "routing_key_prefix"
    assert "not both" in field["message"]


async def test_a_prefix_keeps_to_the_keys_namespace_and_routing_key_grants(node: Node) -> None:
    async with client(node) as http:
        await submit(http, TEAM_A, KEYS)
        await submit(http, TEAM_B, ["billing.charge", "billing.refund"])
        assert await listed(http, TEAM_B, routing_key_prefix="billing") == [
            "billing.charge",
            "billing.refund",
        ]
        assert await listed(http, CHARGES, routing_key_prefix="billing") == [
            "billing.charge",
            "billing.charge.retry",
        ]
        assert await listed(http, CHARGES, routing_key_prefix="billing.refund") == []
        everywhere = await listed(http, routing_key_prefix="billing.refund")
        assert sorted(everywhere) == ["billing.refund", "billing.refund.late"]
