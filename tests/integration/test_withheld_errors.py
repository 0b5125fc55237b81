"""What a failing service's error says about the network stays with the node: ``/readyz`` and
``/v1/queues`` tell a monitor or producer key which check failed, never the host, the port or
the driver's text; the node logs that text and an admin key sees it. A real node on a real
PostgreSQL reached through a relay the test cuts, and RabbitMQ's management API asked with a
wrong password or on a port that refuses."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from devstack.postgres import PostgresServer
from devstack.rabbitmq import RabbitServer
from dispatcher.api import ops
from tests.support import relay
from tests.support.nodes import client, running_node
from tests.support.waiting import until

ADMIN = "admin-token-0123456789"
MONITOR = "monitor-token-0123456789"
PRODUCER = "producer-token-0123456789"
API_KEYS = f"{ADMIN}:admin,{MONITOR}:monitor,{PRODUCER}:producer"
DRIVER_TEXT = ("127.0.0.1", "Connect", "Error", "PostgreSQL unavailable", "answered", "Login")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def assert_nothing_of_the_network(text: str, port: int) -> None:
    for word in (*DRIVER_TEXT, f"{port}"):
        assert word not in text, (word, text)


@pytest.fixture
async def pg_relay(pg_server: PostgresServer) -> AsyncIterator[relay.Relay]:
    async with relay.relay("127.0.0.1", pg_server.port) as made:
        yield made


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port bound but not listening: every connection to it is refused while the test runs."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


def through(database_url: str, port: int) -> str:
    parts = urlsplit(database_url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))


async def test_readyz_withholds_the_databases_error_from_other_keys(
    database_url: str, amqp_url: str, pg_relay: relay.Relay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with (
        running_node(
            database_url=through(database_url, pg_relay.port),
            amqp_url=amqp_url,
            node_id="withheld",
            shard_count=4,
            api_keys=API_KEYS,
        ) as node,
        client(node) as http,
    ):
        admin: dict[str, Any] = {}

        async def refused_on_the_relays_port() -> bool:
            admin.update((await http.get("/readyz", headers=bearer(ADMIN))).json())
            failing = admin["standing"]["failing"].get("postgres")
            said = f"{pg_relay.port}" in str(failing) and "reason" in admin["standing"]
            return said  # the probe's error, and the standing judged from it

        await pg_relay.cut()
        await until(refused_on_the_relays_port, 20)
        answers = [await http.get("/readyz", headers=bearer(k)) for k in (MONITOR, PRODUCER)]
        await pg_relay.heal()
        await until(lambda: _ready(http), 30)  # the node stops on a reachable database
    assert admin["checks"]["postgres"] is False
    assert "127.0.0.1" in admin["standing"]["failing"]["postgres"]["reason"]
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert_nothing_of_the_network(answer.text, pg_relay.port)
        shown = answer.json()
        assert shown["checks"]["postgres"] is False  # which check failed is still said
        assert shown["standing"]["failing"]["postgres"]["reason"] == ops.WITHHELD
        assert shown["standing"]["reason"] == ops.WITHHELD
        assert shown["degraded"]["standing"] == ops.WITHHELD
        assert set(shown["degraded"].values()) == {ops.WITHHELD}
    assert f"127.0.0.1', {pg_relay.port})" in caplog.text  # the node's log has the detail


async def _ready(http: httpx.AsyncClient) -> bool:
    return (await http.get("/readyz", headers=bearer(ADMIN))).status_code == 200


@pytest.mark.parametrize("fault", ["wrong password", "refused"])
async def test_queues_withholds_the_management_apis_answer_from_other_keys(
    database_url: str,
    amqp_url: str,
    rabbit_server: RabbitServer,
    refusing_port: int,
    fault: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    if fault == "refused":
        port, management_url = refusing_port, f"http://guest:guest@127.0.0.1:{refusing_port}"
    else:
        port = rabbit_server.mgmt_port
        management_url = f"http://guest:not-the-password@127.0.0.1:{port}"
    async with (
        running_node(
            database_url=database_url,
            amqp_url=amqp_url,
            node_id="withheld",
            shard_count=4,
            api_keys=API_KEYS,
            amqp_management_url=management_url,
        ) as node,
        client(node) as http,
    ):
        monitor = await http.get("/v1/queues", headers=bearer(MONITOR))
        admin = await http.get("/v1/queues", headers=bearer(ADMIN))
    assert monitor.status_code == admin.status_code == 503
    assert monitor.json() == {"error": "unavailable", "message": ops.QUEUES_UNAVAILABLE}
    assert_nothing_of_the_network(monitor.text, port)
    assert "not-the-password" not in monitor.text + admin.text + caplog.text
    detail = admin.json()["message"]
    assert f"RabbitMQ management API at http://127.0.0.1:{port}" in detail
    assert ("answered 401" if fault == "wrong password" else "ConnectError") in detail
    assert f"GET /v1/queues: {detail}" in caplog.text
