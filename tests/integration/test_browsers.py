"""A browser cannot be used against an in-process node: cross-site form posts change nothing,
body-less writes need a JSON type or a bearer key, DISPATCHER_ALLOWED_HOSTS refuses other Host
names (an open node serves loopback names only), an open node says so in its log, and every
answer forbids framing and sniffing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from dispatcher.auth import api_keys
from dispatcher.node import Node
from dispatcher.store.api_keys import KeyStore
from tests.support.nodes import WRITE, jobs_stored, running_node

JOB = b'{"routing_key": "orders.expire", "payload": 1, "delay_ms": 600000}'


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="browsers",
        shard_count=8,
        allowed_hosts="dispatcher.internal,127.0.0.1:8080",
    ) as running:
        yield running


def anonymous(node: Node, host: str = "dispatcher.internal") -> httpx.AsyncClient:
    """A client that sends only what a page's form could: no default JSON type."""
    transport = httpx.ASGITransport(app=node.serving.app)
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}")


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b", None],
    ids=["text", "urlencoded", "multipart", "none"],
)
async def test_a_form_post_is_refused_415_naming_content_type_and_stores_nothing(
    node: Node, database_url: str, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    async with anonymous(node) as http:
        response = await http.post("/v1/jobs", content=JOB, headers=headers)
        batch = await http.post(
            "/v1/jobs/batch", content=b'{"jobs": [' + JOB + b"]}", headers=headers
        )
    for answer in (response, batch):
        assert answer.status_code == 415, answer.text
        assert [f["field"] for f in answer.json()["fields"]] == ["content-type"]
    assert await jobs_stored(database_url) == 0


async def test_body_less_writes_need_a_json_type_or_a_bearer_key(node: Node) -> None:
    async with anonymous(node) as http:
        created = (await http.post("/v1/jobs", content=JOB, headers=WRITE)).json()
    path = f"/v1/jobs/{created['id']}"
    async with anonymous(node) as http:
        cancel = await http.delete(path)
        requeue = await http.post(f"{path}/requeue")
        assert (await http.get(path)).json()["state"] == "scheduled"  # reads need neither
        cancelled = await http.delete(path, headers=WRITE)
    for refused in (cancel, requeue):
        assert refused.status_code == 415, refused.text
        assert [f["field"] for f in refused.json()["fields"]] == ["content-type"]
        assert "application/json" in refused.json()["message"]
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"


async def test_a_host_not_allowed_is_refused_400_naming_it_and_healthz_is_exempt(
    node: Node, database_url: str
) -> None:
    async with anonymous(node, host="rebound.example") as http:
        read = await http.get("/v1/jobs")
        write = await http.post("/v1/jobs", content=JOB, headers=WRITE)
        health = await http.get("/healthz")
    async with anonymous(node, host="127.0.0.1:8080") as http:
        listed = await http.get("/v1/jobs")
    async with anonymous(node, host="127.0.0.1:9999") as http:
        other_port = await http.get("/v1/jobs")
    for refused in (read, write, other_port):
        assert refused.status_code == 400, refused.text
        assert [f["field"] for f in refused.json()["fields"]] == ["host"]
    assert "rebound.example" in read.json()["message"]
    assert health.status_code == 200
    assert listed.status_code == 200
    assert await jobs_stored(database_url) == 0


@pytest.mark.parametrize(("host", "warnings"), [("127.0.0.1", 1), ("0.0.0.0", 2)])
async def test_an_open_node_logs_that_it_is_open_and_warns_again_off_loopback(
    database_url: str, amqp_url: str, caplog: pytest.LogCaptureFixture, host: str, warnings: int
) -> None:
    caplog.set_level(logging.INFO, logger="dispatcher.node")
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, node_id="open", http_host=host
    ):
        pass
    said = [
        record.getMessage()
        for record in caplog.records
        if record.name == "dispatcher.node" and record.levelno == logging.WARNING
    ]
    assert f"the API is OPEN at http://{host}:8080" in said[0]
    assert len([message for message in said if "open" in message.lower()]) == warnings


@pytest.fixture
async def open_node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    """No key and no DISPATCHER_ALLOWED_HOSTS: every caller is an admin."""
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, node_id="open", shard_count=4
    ) as running:
        yield running


async def test_an_open_node_serves_loopback_names_only_until_a_key_exists(
    open_node: Node, database_url: str
) -> None:
    """Probed: a page that rebinds its name to 127.0.0.1 got full read and write of an open
    node. Open, it answers its own machine's names only; with keys, the key decides."""
    async with anonymous(open_node, host="rebound.example") as http:
        read = await http.get("/v1/jobs")
        write = await http.post("/v1/jobs", content=JOB, headers=WRITE)
        health = await http.get("/healthz")
    served = []
    for host in ("127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:8080"):
        async with anonymous(open_node, host=host) as http:
            served.append((await http.get("/v1/jobs")).status_code)
    for refused in (read, write):
        assert refused.status_code == 400, refused.text
        assert [f["field"] for f in refused.json()["fields"]] == ["host"]
        assert "DISPATCHER_ALLOWED_HOSTS" in refused.json()["message"]
    assert health.status_code == 200
    assert served == [200] * 4
    assert await jobs_stored(database_url) == 0
    _, token = await KeyStore(open_node.core.db).create(scope=api_keys.Scope.PRODUCER)
    async with anonymous(open_node, host="rebound.example") as http:
        until = asyncio.get_running_loop().time() + 5
        while (answer := await http.get("/v1/jobs")).status_code == 400:
            assert asyncio.get_running_loop().time() < until, answer.text
            await asyncio.sleep(0.05)
        keyed = await http.get("/v1/jobs", headers={"authorization": f"Bearer {token}"})
    assert answer.status_code == 401  # auth is on: the key, not the name, decides
    assert keyed.status_code == 200


@pytest.mark.parametrize(
    ("path", "policy"),
    [
        ("/v1/jobs", "default-src 'none'; frame-ancestors 'none'"),
        ("/healthz", "default-src 'none'; frame-ancestors 'none'"),
        ("/console/", "default-src 'self';"),
        ("/console/console.js", "default-src 'self';"),
        ("/docs", "script-src 'self' 'unsafe-inline'"),
        ("/redoc", "frame-ancestors 'none'"),
        ("/v1/jobs/not-an-id", "default-src 'none'"),  # an error answer too
    ],
)
async def test_every_answer_forbids_framing_and_sniffing(
    open_node: Node, path: str, policy: str
) -> None:
    """Probed: the console and /docs sent no framing headers, so any site could frame an open
    node's console and trick a click on Requeue or Pause."""
    async with anonymous(open_node, host="127.0.0.1") as http:
        answer = await http.get(path)
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert policy in answer.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
