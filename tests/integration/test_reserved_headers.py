"""Headers a producer must not set (``contract.header_name_problem``): refused naming the header by
the API (single and batch), schedules (create and change) and ``enqueue``, storing nothing; and
never published from a row that holds one anyway."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import orjson
import pytest
import pytest_asyncio

from consumers_sdk import contract
from consumers_sdk.enqueue import enqueue
from devstack.collector import Collector
from dispatcher.node import Node
from dispatcher.store.queries import shards as queries
from tests.support.nodes import ON_THE_MODULES_NODE, client, running_node

ADMIN = "admin-token-0123456789"
BILLING = "producer-billing-token-0123"  # may only use routing keys starting with "billing."
API_KEYS = f"{ADMIN}:admin,{BILLING}:producer:team-a:billing."
FORGED = {"x-dead-routing-key": "payments.charge"}
LONG_NAME = "é" * 64 + "h"  # 129 bytes in 65 characters
REFUSED = [
    ("x-dead-routing-key", "payments.charge"),
    ("X-Delivery-Count", 1),
    ("x-death", "forged"),
    ("x-first-death-queue", "q"),
    ("x-last-death-reason", "rejected"),
    ("x-dispatcher-round", str(uuid.uuid4())),
    ("x-stream-offset", 1),
    ("x-opt-partition-key", "p"),
    ("x-received-from", "upstream"),
    ("x-shovelled", "shovel"),
    ("CC", "payments.charge"),
    ("bcc", "payments.charge"),
    (LONG_NAME, 1),
]


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


NODE = {"node_id": "reserved", "shard_count": 4, "api_keys": API_KEYS}


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


async def count(database_url: str, table: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        return int(await connection.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await connection.close()


def refused_fields(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 422, answer.text
    return [item["field"] for item in answer.json()["fields"]]


@pytest.mark.parametrize(("name", "value"), REFUSED, ids=[name[:20] for name, _ in REFUSED])
@ON_THE_MODULES_NODE
async def test_the_api_refuses_a_reserved_or_overlong_header_by_name_and_stores_nothing(
    refusing_node: Node, module_database_url: str, name: str, value: object
) -> None:
    job = {"routing_key": "billing.charge", "payload": 1, "headers": {"tenant": "a", name: value}}
    async with client(refusing_node) as http:
        single = await http.post("/v1/jobs", json=job, headers=bearer(BILLING))
        batch = await http.post(
            "/v1/jobs/batch",
            json={"jobs": [{"routing_key": "billing.ok", "payload": 1}, job]},
            headers=bearer(BILLING),
        )
    assert refused_fields(single) == [f"headers.{name}"]
    assert refused_fields(batch) == [f"jobs[1].headers.{name}"]
    assert await count(module_database_url, "jobs") == 0


async def test_a_key_limited_to_billing_cannot_send_its_job_to_payments_through_the_dlq(
    node: Node, database_url: str
) -> None:
    """``dispatcher dlq requeue --job`` publishes a dead job to its ``x-dead-routing-key``: a
    producer setting it would reach routing keys its key does not allow."""
    async with client(node) as http:
        allowed = await http.post(
            "/v1/jobs",
            json={"routing_key": "billing.charge", "payload": 1, "delay_ms": 600_000},
            headers=bearer(BILLING),
        )
        assert allowed.status_code == 201, allowed.text
        forged = await http.post(
            "/v1/jobs",
            json={"routing_key": "billing.charge", "payload": 1, "headers": FORGED},
            headers=bearer(BILLING),
        )
        assert refused_fields(forged) == ["headers.x-dead-routing-key"]
        assert "reserved" in forged.json()["message"]
    assert await count(database_url, "jobs") == 1


async def test_schedules_refuse_a_reserved_header_on_create_and_on_change(
    node: Node, database_url: str
) -> None:
    schedule = {
        "name": "nightly",
        "interval_s": 3600,
        "job": {"routing_key": "billing.report", "payload": 1, "headers": FORGED},
    }
    async with client(node) as http:
        created = await http.post("/v1/schedules", json=schedule, headers=bearer(BILLING))
        assert refused_fields(created) == ["job.headers.x-dead-routing-key"]
        assert await count(database_url, "schedules") == 0

        schedule["job"] = {"routing_key": "billing.report", "payload": 1, "headers": {"t": "a"}}
        ok = await http.post("/v1/schedules", json=schedule, headers=bearer(BILLING))
        assert ok.status_code == 201, ok.text
        changed = await http.patch(
            "/v1/schedules/nightly",
            json={"job": {"routing_key": "billing.report", "payload": 2, "headers": {"CC": "x"}}},
            headers=bearer(BILLING),
        )
        assert refused_fields(changed) == ["job.headers.CC"]
        kept = (await http.get("/v1/schedules/nightly", headers=bearer(BILLING))).json()
    assert kept["job"]["headers"] == {"t": "a"}
    assert kept["job"]["payload"] == 1


@pytest.mark.parametrize(("name", "value"), REFUSED, ids=[name[:20] for name, _ in REFUSED])
async def test_enqueue_refuses_a_reserved_or_overlong_header_by_name_and_stores_nothing(
    module_database_url: str, name: str, value: str | int
) -> None:
    connection = await asyncpg.connect(module_database_url)
    try:
        await connection.execute(queries.ENSURE_SHARDS, 4)
        with pytest.raises(ValueError, match=f"^{re.escape(f'headers.{name}: ')}") as refused:
            await enqueue(connection, "billing.charge", 1, headers={"tenant": "a", name: value})
        assert "reserved" in str(refused.value) or "128 bytes" in str(refused.value)
        assert await connection.fetchval("SELECT count(*) FROM jobs") == 0
    finally:
        await connection.close()


async def test_a_row_stored_with_a_reserved_header_is_published_without_it(
    node: Node, database_url: str, amqp_url: str
) -> None:
    """A row written before a name was reserved (or by hand) cannot forge it: the publisher drops
    it, and keeps the producer's own headers and the job's retry policy."""
    collector = Collector(amqp_url, binding="billing.#")
    await collector.start()
    job_id = uuid.uuid4()
    stored = {
        "tenant": "a",
        **FORGED,
        "CC": "payments.charge",
        contract.HEADER_MAX_ATTEMPTS: 3,
        "x-dispatcher-round": "forged",
    }
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(  # with the due notice enqueue sends, so it fires at once
            "INSERT INTO jobs (id, shard, routing_key, payload, headers, run_at) "
            "VALUES ($1, 0, 'billing.charge', '1', $2::jsonb, now()) "
            "RETURNING pg_notify('dispatcher_due', id || ',0,' || extract(epoch FROM run_at) "
            "|| ',billing.charge')",
            job_id,
            orjson.dumps(stored).decode(),
        )
        assert await collector.wait_for([str(job_id)], 30) == set()
    finally:
        await connection.close()
        await collector.stop()
    [delivery] = collector.deliveries[str(job_id)]
    headers = delivery.headers
    assert headers["tenant"] == "a"
    assert headers[contract.HEADER_MAX_ATTEMPTS] == 3
    assert "x-dead-routing-key" not in headers
    assert "CC" not in headers
    assert headers.get("x-dispatcher-round") != "forged"
