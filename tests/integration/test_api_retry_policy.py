"""A job's own retry policy through the HTTP API: validated fields, stored and published as the
contract's x-retry- headers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio

from consumers_sdk import DispatcherClient, contract
from devstack.collector import Collector
from dispatcher.node import Node
from tests.support.nodes import ON_THE_MODULES_NODE, client, running_node

NODE = {"node_id": "policy-test", "shard_count": 8}


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


async def test_the_policy_fields_are_published_as_contract_headers(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        response = await http.post(
            "/v1/jobs",
            json={
                "routing_key": "orders.expire",
                "payload": {"order": 1},
                "headers": {"tenant": "acme"},
                "max_attempts": 2,
                "retry_backoff_s": [0.5, 2, 30],
            },
        )
    assert response.status_code == 201, response.text
    job = response.json()
    policy = {"x-retry-max-attempts": 2, "x-retry-backoff-s": "0.5,2,30"}
    assert job["headers"] == {"tenant": "acme", **policy}
    assert await collector.wait_for([job["id"]], 15) == set()
    [delivery] = collector.deliveries[job["id"]]
    assert {name: delivery.headers[name] for name in policy} == policy
    assert delivery.headers["tenant"] == "acme"
    assert contract.read_retry_policy(delivery.headers) == contract.RetryPolicy(
        max_attempts=2, backoff_s=(0.5, 2.0, 30.0)
    )


async def test_the_client_sends_the_policy(node: Node) -> None:
    transport = httpx.ASGITransport(app=node.serving.app)
    async with DispatcherClient("http://127.0.0.1", transport=transport) as dispatcher:
        job = await dispatcher.schedule(
            "orders.expire", {}, max_attempts=9, retry_backoff=[timedelta(seconds=1), 2.5]
        )
    assert job.headers == {"x-retry-max-attempts": 9, "x-retry-backoff-s": "1,2.5"}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 101}, "max_attempts"),
        ({"max_attempts": "3"}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"retry_backoff_s": []}, "retry_backoff_s"),
        ({"retry_backoff_s": [1] * 101}, "retry_backoff_s"),
        ({"retry_backoff_s": [1, -1]}, "retry_backoff_s[1]"),
        ({"retry_backoff_s": [3600.5]}, "retry_backoff_s[0]"),
        ({"retry_backoff_s": ["1"]}, "retry_backoff_s[0]"),
        ({"retry_backoff_s": 5}, "retry_backoff_s"),
        ({"headers": {"x-retry-max-attempts": 2}}, "headers.x-retry-max-attempts"),
    ],
)
@ON_THE_MODULES_NODE
async def test_a_bad_policy_is_refused_naming_the_field_and_stores_nothing(
    refusing_node: Node, fields: dict[str, Any], field: str
) -> None:
    async with client(refusing_node) as http:
        response = await http.post(
            "/v1/jobs", json={"routing_key": "orders.expire", "payload": {}, **fields}
        )
        listed = (await http.get("/v1/jobs")).json()
    assert response.status_code == 422, response.text
    assert [problem["field"] for problem in response.json()["fields"]] == [field]
    assert listed["jobs"] == []
