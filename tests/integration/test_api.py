"""The HTTP API of one in-process node, end to end through real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
import orjson
import pytest
import pytest_asyncio

from consumers_sdk import contract
from devstack.collector import ON_TIME_S, Collector
from dispatcher.node import Node
from tests.support.nodes import ON_THE_MODULES_NODE, client, jobs_stored, running_node

NODE = {"node_id": "api-test", "shard_count": 16}


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


@pytest.fixture
async def collector(amqp_url: str) -> AsyncIterator[Collector]:
    consumer = Collector(amqp_url, binding="orders.#")
    await consumer.start()
    yield consumer
    await consumer.stop()


async def wait_for_state(node: Node, job_id: str, state: str) -> dict[str, object]:
    async with client(node) as http, asyncio.timeout(10):
        while True:
            job: dict[str, object] = (await http.get(f"/v1/jobs/{job_id}")).json()
            if job["state"] == state:
                return job
            await asyncio.sleep(0.05)


async def test_job_arrives_at_its_due_time_with_the_contract_properties(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        response = await http.post(
            "/v1/jobs",
            json={
                "routing_key": "orders.expire",
                "payload": {"order": 123},
                "delay_ms": 1200,
                "idempotency_key": "order-123-expiry",
                "headers": {"tenant": "acme", "attempt_budget": 3},
                "priority": 5,
                "ttl_ms": 60_000,
            },
        )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["state"] == "scheduled"
    run_at = datetime.fromisoformat(job["run_at"]).timestamp()
    assert await collector.wait_for([job["id"]], 15) == set()
    [delivery] = collector.deliveries[job["id"]]
    assert delivery.received_at >= run_at
    assert delivery.received_at - run_at < ON_TIME_S
    assert orjson.loads(delivery.body) == {"order": 123}
    assert delivery.routing_key == "orders.expire"
    assert delivery.properties["content_type"] == "application/json"
    assert delivery.properties["delivery_mode"] == aio_pika.DeliveryMode.PERSISTENT
    assert delivery.properties["priority"] == 5
    assert delivery.properties["timestamp"] is not None
    expiration = delivery.properties["expiration"]
    assert expiration is not None
    assert 0 < float(expiration) <= 60.0  # aio-pika reports the remaining ttl in seconds
    assert delivery.headers[contract.HEADER_JOB_ID] == job["id"]
    assert delivery.headers[contract.HEADER_IDEMPOTENCY_KEY] == "order-123-expiry"
    assert contract.parse_run_at(
        str(delivery.headers[contract.HEADER_RUN_AT])
    ) == datetime.fromisoformat(job["run_at"]).replace(
        microsecond=datetime.fromisoformat(job["run_at"]).microsecond // 1000 * 1000
    )
    assert delivery.headers["tenant"] == "acme"
    assert delivery.headers["attempt_budget"] == 3
    # The mark follows the confirm, so a consumer may see the message a moment before it.
    stored = await wait_for_state(node, job["id"], "dispatched")
    assert stored["dispatched_at"] is not None


async def test_a_past_run_at_fires_at_once(node: Node, collector: Collector) -> None:
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    async with client(node) as http:
        job = (
            await http.post(
                "/v1/jobs", json={"routing_key": "orders.a", "payload": 1, "run_at": past}
            )
        ).json()
    assert await collector.wait_for([job["id"]], 10) == set()


async def test_cancelled_job_is_never_published(node: Node, collector: Collector) -> None:
    async with client(node) as http:
        doomed = (
            await http.post(
                "/v1/jobs", json={"routing_key": "orders.a", "payload": 1, "delay_ms": 800}
            )
        ).json()
        marker = (
            await http.post(
                "/v1/jobs", json={"routing_key": "orders.a", "payload": 2, "delay_ms": 1500}
            )
        ).json()
        cancel = await http.delete(f"/v1/jobs/{doomed['id']}")
        assert cancel.status_code == 200
        assert cancel.json()["state"] == "cancelled"
        assert await collector.wait_for([marker["id"]], 15) == set()
        await collector.settle(0.5)
        assert doomed["id"] not in collector.deliveries
        again = await http.delete(f"/v1/jobs/{doomed['id']}")
        assert again.status_code == 409
        assert again.json()["state"] == "cancelled"
        await wait_for_state(node, marker["id"], "dispatched")
        dispatched = await http.delete(f"/v1/jobs/{marker['id']}")
        assert dispatched.status_code == 409
        assert dispatched.json()["state"] == "dispatched"
        missing = await http.delete("/v1/jobs/01890000-0000-7000-8000-000000000000")
        assert missing.status_code == 404


async def test_idempotency_key_creates_one_job_and_one_message(
    node: Node, collector: Collector
) -> None:
    body = {"routing_key": "orders.b", "payload": 1, "delay_ms": 300, "idempotency_key": "k-1"}
    async with client(node) as http:
        first = await http.post("/v1/jobs", json=body)
        second = await http.post("/v1/jobs", json={**body, "payload": 2})
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert second.json()["created"] is False
    assert await collector.wait_for([first.json()["id"]], 10) == set()
    await collector.settle(0.5)
    assert len(collector.deliveries) == 1


@pytest.mark.rabbitmq_version
async def test_unroutable_job_is_parked_in_the_unroutable_queue(node: Node, amqp_url: str) -> None:
    async with client(node) as http:
        job = (
            await http.post("/v1/jobs", json={"routing_key": "nobody.listens", "payload": 7})
        ).json()
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(contract.UNROUTABLE_QUEUE, passive=True)
        message = None
        deadline = time.monotonic() + 10
        while message is None and time.monotonic() < deadline:
            message = await queue.get(fail=False, no_ack=True)
            if message is None:
                await asyncio.sleep(0.1)
        assert message is not None
        assert message.message_id == job["id"]
        assert message.routing_key == "nobody.listens"
    finally:
        await connection.close()


async def test_batch_is_stored_and_fired(node: Node, collector: Collector) -> None:
    jobs = [{"routing_key": "orders.batch", "payload": i, "delay_ms": 200} for i in range(300)]
    async with client(node) as http:
        response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201
    ids = [job["id"] for job in response.json()["jobs"]]
    assert len(set(ids)) == 300
    assert await collector.wait_for(ids, 20) == set()


async def test_expired_job_is_not_published(node: Node, collector: Collector) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    async with client(node) as http:
        stale = (
            await http.post(
                "/v1/jobs",
                json={"routing_key": "orders.c", "payload": 1, "run_at": past, "ttl_ms": 1000},
            )
        ).json()
        fresh = (
            await http.post(
                "/v1/jobs",
                json={"routing_key": "orders.c", "payload": 2, "run_at": past, "ttl_ms": 60000},
            )
        ).json()
        assert await collector.wait_for([fresh["id"]], 10) == set()
        await collector.settle(0.5)
        assert stale["id"] not in collector.deliveries
    await wait_for_state(node, stale["id"], "expired")


async def test_list_filters_by_state_and_pages_with_a_cursor(node: Node) -> None:
    async with client(node) as http:
        for i in range(5):
            await http.post(
                "/v1/jobs", json={"routing_key": "orders.list", "payload": i, "delay_ms": 600_000}
            )
        first = (
            await http.get(
                "/v1/jobs", params={"state": "scheduled", "routing_key": "orders.list", "limit": 3}
            )
        ).json()
        assert len(first["jobs"]) == 3
        rest = (
            await http.get(
                "/v1/jobs", params={"state": "scheduled", "limit": 3, "after": first["next_after"]}
            )
        ).json()
        assert [j["payload"] for j in first["jobs"] + rest["jobs"]] == [0, 1, 2, 3, 4]
        assert rest["next_after"] is None
        bad = await http.get("/v1/jobs", params={"state": "nope"})
        assert bad.status_code == 422
        assert bad.json()["fields"][0]["field"] == "state"


JOB = {"routing_key": "a", "payload": 1}

BAD_REQUESTS: list[tuple[str, str, bytes, int, str]] = [
    ("malformed JSON", "/v1/jobs", b'{"routing_key": "a", ', 400, "body"),
    ("not UTF-8", "/v1/jobs", b"\xff", 400, "body"),
    ("wrong type", "/v1/jobs", b'{"routing_key": 5, "payload": 1}', 422, "routing_key"),
    (
        "unknown field",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "colour": 1}',
        422,
        "colour",
    ),
    (
        "both times",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "delay_ms": 1, "run_at": "2030-01-01T00:00:00Z"}',
        422,
        "run_at",
    ),
    (
        "routing key too long",
        "/v1/jobs",
        orjson.dumps({"routing_key": "a" * 256, "payload": 1}),
        422,
        "routing_key",
    ),
    (
        "payload too large",
        "/v1/jobs",
        orjson.dumps({"routing_key": "a", "payload": "x" * 300_000}),
        413,
        "payload",
    ),
    (
        "reserved header",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "headers": {"x-death": 1}}',
        422,
        "headers.x-death",
    ),
    ("not an object", "/v1/jobs", b"[1, 2]", 422, "body"),
    # Found by the fuzz tests: all but the last of these once answered 500.
    (
        "payload integer past 64 bits",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1180591620717411303424}',
        422,
        "payload",
    ),
    (
        "header integer past 64 bits",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "headers": {"h": 1180591620717411303424}}',
        422,
        "headers.h",
    ),
    (
        "delay past any date",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "delay_ms": 1180591620717411303424}',
        422,
        "delay_ms",
    ),
    (
        "ttl past 64 bits",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "ttl_ms": 1180591620717411303424}',
        422,
        "ttl_ms",
    ),
    (
        "run_at before year 1 in UTC",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "run_at": "0001-01-01T00:00:00+14:00"}',
        422,
        "run_at",
    ),
    (
        "header with NUL",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "headers": {"h": "a\\u0000b"}}',
        422,
        "headers.h",
    ),
    (
        "header with a lone surrogate",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "headers": {"h": "\\ud800"}}',
        422,
        "headers.h",
    ),
    (
        "idempotency key with NUL",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "idempotency_key": "k\\u0000"}',
        422,
        "idempotency_key",
    ),
    (
        "payload with a lone surrogate",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": "\\ud800"}',
        422,
        "payload",
    ),
    (
        "unknown field named by a lone surrogate",
        "/v1/jobs",
        b'{"routing_key": "a", "payload": 1, "\\ud800": 1}',
        422,
        "body",
    ),
    # The documented limits at their defaults (configured values: tests/unit/test_schemas.py).
    (
        "too many headers",
        "/v1/jobs",
        orjson.dumps({**JOB, "headers": {f"h{i}": i for i in range(33)}}),
        422,
        "headers",
    ),
    (
        "header too large",
        "/v1/jobs",
        orjson.dumps({**JOB, "headers": {"h": "v" * 1024}}),
        422,
        "headers.h",
    ),
    (
        "idempotency key too long",
        "/v1/jobs",
        orjson.dumps({**JOB, "idempotency_key": "k" * 256}),
        422,
        "idempotency_key",
    ),
    (
        "run_at too far ahead",
        "/v1/jobs",
        orjson.dumps({**JOB, "run_at": "2999-01-01T00:00:00Z"}),
        422,
        "run_at",
    ),
    (
        "batch item invalid",
        "/v1/jobs/batch",
        orjson.dumps({"jobs": [JOB, {**JOB, "priority": 12}]}),
        422,
        "jobs[1].priority",
    ),
    (
        "batch too large",
        "/v1/jobs/batch",
        orjson.dumps({"jobs": [{"routing_key": "a", "payload": 1}] * 1001}),
        422,
        "jobs",
    ),
    (
        "batch repeats a key",
        "/v1/jobs/batch",
        orjson.dumps({"jobs": [{**JOB, "idempotency_key": "k"}, {**JOB, "idempotency_key": "k"}]}),
        422,
        "jobs[1].idempotency_key",
    ),
    (
        "batch payload too large",
        "/v1/jobs/batch",
        orjson.dumps(
            {
                "jobs": [
                    {"routing_key": "a", "payload": 1},
                    {"routing_key": "a", "payload": "x" * 300_000},
                ]
            }
        ),
        413,
        "jobs[1].payload",
    ),
    (
        "body too large",
        "/v1/jobs/batch",
        orjson.dumps({"jobs": [{"routing_key": "a", "payload": "x" * 200_000}] * 90}),
        413,
        "body",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
@ON_THE_MODULES_NODE
async def test_bad_input_is_refused_by_name_and_stores_nothing(
    refusing_node: Node, module_database_url: str, path: str, body: bytes, status: int, field: str
) -> None:
    before = await jobs_stored(module_database_url)
    async with client(refusing_node) as http:
        response = await http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    problem = response.json()
    assert field in [item["field"] for item in problem["fields"]], problem
    assert problem["message"]
    assert await jobs_stored(module_database_url) == before


def in_a_batch(body: bytes, status: int, field: str) -> tuple[bytes, int, str]:
    """The same bad job second in a batch, behind a good one: refused as ``jobs[1]``."""
    batch = b'{"jobs": [' + orjson.dumps(JOB) + b", " + body + b"]}"
    if status == 400:  # undecodable: the whole body is at fault
        return batch, status, "body"
    return batch, status, "jobs[1]" if field == "body" else f"jobs[1].{field}"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [in_a_batch(*case[2:]) for case in BAD_REQUESTS if case[1] == "/v1/jobs"],
    ids=[case[0] for case in BAD_REQUESTS if case[1] == "/v1/jobs"],
)
@ON_THE_MODULES_NODE
async def test_a_bad_job_in_a_batch_is_refused_by_name_and_stores_nothing(
    refusing_node: Node, module_database_url: str, body: bytes, status: int, field: str
) -> None:
    """The batch route validates its JSON text itself (``schemas.batch_from_json``): it must
    refuse exactly as FastAPI's validation of the single route does."""
    before = await jobs_stored(module_database_url)
    async with client(refusing_node) as http:
        response = await http.post(
            "/v1/jobs/batch", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == status, response.text
    problem = response.json()
    assert field in [item["field"] for item in problem["fields"]], problem
    assert problem["message"]
    assert await jobs_stored(module_database_url) == before


@pytest.mark.parametrize("routing_key", ["a\x00", "\ud800", "orders.*"])
@ON_THE_MODULES_NODE
async def test_a_list_filter_that_is_no_routing_key_is_refused_by_name(
    refusing_node: Node, routing_key: str
) -> None:
    async with client(refusing_node) as http:
        response = await http.get(
            "/v1/jobs", params={"routing_key": routing_key.encode("utf-8", "surrogatepass")}
        )
    assert response.status_code == 422, response.text
    assert response.json()["fields"][0]["field"] == "routing_key"


async def test_operations_endpoints(node: Node) -> None:
    async with client(node) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"] == {
            "postgres": True,
            "rabbitmq": True,
            "zookeeper": True,
            "shards": True,
            "clock": True,
            "standing": True,
            "loops": True,
        }
        clock = ready.json()["clock"]
        assert clock["trusted"] is True
        assert abs(clock["offset_s"]) < 0.05  # this host's clock is PostgreSQL's
        assert 0 <= clock["error_s"] < 0.05
        assert ready.json()["publish_path"] == {"path": "framed", "fallback_reason": None}
        metrics = (await http.get("/metrics")).text
        assert "dispatcher_jobs_submitted_total" in metrics
        assert "dispatcher_fire_lateness_seconds_bucket" in metrics
        cluster = (await http.get("/v1/cluster")).json()
        assert cluster["mode"] == "single-node"
        assert len(cluster["assignment"]["api-test"]) == 16
        spec = (await http.get("/openapi.json")).json()
        assert {"/v1/jobs", "/v1/jobs/batch", "/v1/jobs/{job_id}"} <= spec["paths"].keys()


async def test_concurrent_single_posts_share_commits_and_each_is_stored(
    node: Node, database_url: str
) -> None:
    before = node.submission.intake.group_commit.flushes
    async with client(node) as http:
        responses = await asyncio.gather(
            *(
                http.post(
                    "/v1/jobs", json={"routing_key": "orders.gc", "payload": i, "delay_ms": 60_000}
                )
                for i in range(60)
            )
        )
    assert [r.status_code for r in responses] == [201] * 60
    assert len({r.json()["id"] for r in responses}) == 60
    assert (
        node.submission.intake.group_commit.flushes - before < 60
    )  # fewer round trips than requests
    assert await jobs_stored(database_url) == 60
