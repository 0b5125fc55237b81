"""A browser cannot be used against an in-process node: cross-site form posts change nothing,
body-less writes need a JSON type or a bearer key, DISPATCHER_ALLOWED_HOSTS refuses other Host
names, and an open node says so in its log."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from dispatcher.node import Node
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
    transport = httpx.ASGITransport(app=node.app)
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
