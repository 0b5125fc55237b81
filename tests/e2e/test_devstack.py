"""`make run`, `make cluster` and `make down`'s commands (``python -m devstack``) on free ports and
a throwaway root: single node starts no ZooKeeper, the cluster's three nodes share the shards
(and a second `cluster` refuses to start more), and down leaves no process and no port behind."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest

from consumers_sdk import contract
from devstack import nodes, tenants
from devstack.base import service_root, wait_until
from devstack.ports import reserve_port
from dispatcher.settings import Settings
from tests.integration.test_tenants import refused

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
COMMAND_S = 600  # three services and three nodes start slowly on a loaded machine


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Stack:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {
            name: reserve_port()
            for name in ("postgres", "amqp", "management", "distribution", "zookeeper")
        }
        self.http_ports = [reserve_port() for _ in range(3)]

    def attempt(self, command: str) -> subprocess.CompletedProcess[str]:
        options = [f"--{name}-port={port}" for name, port in self.ports.items()]
        options += [f"--root={self.root}", f"--http-ports={','.join(map(str, self.http_ports))}"]
        return subprocess.run(
            [sys.executable, "-m", "devstack", command, *options],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=COMMAND_S,
        )

    def run(self, command: str) -> str:
        result = self.attempt(command)
        assert result.returncode == 0, f"{command}: {result.stdout}\n{result.stderr}"
        return result.stdout

    def serve(self, http_port: int) -> subprocess.Popen[bytes]:
        """`make run`'s command, in the background here."""
        options = [f"--{name}-port={port}" for name, port in self.ports.items()]
        with (self.root / "serve.log").open("wb") as log:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "devstack",
                    "serve",
                    f"--root={self.root}",
                    f"--http-port={http_port}",
                    *options,
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def serve_log(self) -> str:
        return (self.root / "serve.log").read_text()

    def view(self, port: int) -> dict[str, Any]:
        response = httpx.get(f"http://127.0.0.1:{port}/v1/cluster", timeout=10)
        response.raise_for_status()
        view: dict[str, Any] = response.json()
        return view

    def agreed(self) -> bool:
        """Three members, the same assignment everywhere, and each shard owned by one node."""
        try:
            views = [self.view(port) for port in self.http_ports]
        except httpx.HTTPError:
            return False
        assignments = [view["assignment"] for view in views]
        owned = [set(view["owned"]) for view in views]
        assigned = {shard for shards in assignments[0].values() for shard in shards}
        return (
            all(sorted(view["members"]) == ["node-1", "node-2", "node-3"] for view in views)
            and all(assignment == assignments[0] for assignment in assignments)
            and all(owned[i] == set(assignments[0][view["node"]]) for i, view in enumerate(views))
            and sum(len(shards) for shards in owned) == len(assigned) > 0
            and set().union(*owned) == assigned
        )


def naptime(port: int) -> str:
    async def show() -> str:
        connection = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres")
        try:
            return str(await connection.fetchval("SHOW autovacuum_naptime"))
        finally:
            await connection.close()

    return asyncio.run(show())


@pytest.fixture
def stack() -> Iterator[Stack]:
    stack = Stack(service_root("devstack"))
    yield stack
    subprocess.run(  # whatever the test left running
        [sys.executable, "-m", "devstack", "down", f"--root={stack.root}"],
        cwd=ROOT,
        capture_output=True,
        timeout=COMMAND_S,
    )
    shutil.rmtree(stack.root, ignore_errors=True)


def test_up_starts_postgres_and_rabbitmq_only_and_cluster_adds_zookeeper_and_three_nodes(
    stack: Stack,
) -> None:
    out = stack.run("up")
    assert answers(stack.ports["postgres"])
    assert naptime(stack.ports["postgres"]) == "5s"  # QUEUE_SETTINGS, what `make run` runs with
    assert answers(stack.ports["amqp"])
    assert not answers(stack.ports["zookeeper"])
    assert "ZooKeeper" not in out
    assert nodes.running(stack.root) == []

    # `make run`'s node: in the foreground, refused beside a cluster, stopped by `down`.
    serve_port = reserve_port()
    served = stack.serve(serve_port)
    try:
        assert wait_until(lambda: ready(serve_port), 120), stack.serve_log()
        assert nodes.running(stack.root) == ["dispatcher"]
        refused = stack.attempt("cluster")
        assert refused.returncode != 0
        assert "dispatcher already run" in refused.stderr
        stack.run("down")
        assert served.wait(timeout=60) is not None
        assert nodes.running(stack.root) == []
        assert not answers(serve_port)
    finally:
        served.kill()

    out = stack.run("cluster")
    assert answers(stack.ports["zookeeper"])
    assert nodes.running(stack.root) == ["node-1", "node-2", "node-3"]
    for port in stack.http_ports:
        assert f"http://127.0.0.1:{port}" in out
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200
    assert wait_until(stack.agreed, 120), [stack.view(port) for port in stack.http_ports]
    again = stack.attempt("cluster")
    assert again.returncode != 0
    assert "already run" in again.stderr
    assert nodes.running(stack.root) == ["node-1", "node-2", "node-3"]

    pids = [int(path.read_text().split()[0]) for path in (stack.root / "nodes").glob("*.pid")]
    assert len(pids) == 3
    stack.run("down")
    assert [pid for pid in pids if nodes.alive(pid)] == []
    ports = [*stack.ports.values(), *stack.http_ports]
    assert wait_until(lambda: not any(answers(port) for port in ports), 60), [
        port for port in ports if answers(port)
    ]


async def tenant_attempts(amqp_port: int) -> dict[str, str]:
    """What the broker `make run` started answers each tenant's user trying the other's jobs
    and events, and its own keys."""
    billing = tenants.url(amqp_port, "billing")

    async def bind_payments_jobs(channel: aio_pika.abc.AbstractChannel) -> None:
        spy = await channel.declare_queue("billing.spy", exclusive=True)
        await spy.bind(contract.EXCHANGE, "payments.#")

    async def publish_a_payments_event(channel: aio_pika.abc.AbstractChannel) -> None:
        events = await channel.get_exchange(contract.EVENTS_EXCHANGE, ensure=False)
        await events.publish(aio_pika.Message(b"[]"), routing_key="payments.charge")

    answers = {
        "bind payments.#": await refused(bind_payments_jobs, billing),
        "publish a payments event": await refused(publish_a_payments_event, billing),
    }
    connection = await aio_pika.connect(billing)
    try:
        own = await (await connection.channel()).declare_queue("billing.own", exclusive=True)
        await own.bind(contract.EXCHANGE, "billing.#")
        answers["bind billing.#"] = "bound"
    finally:
        await connection.close()
    return answers


def test_make_run_starts_with_each_tenant_isolated_on_the_broker(stack: Stack) -> None:
    serve_port = reserve_port()
    served = stack.serve(serve_port)
    try:
        assert wait_until(lambda: ready(serve_port), 300), stack.serve_log()
        pid = int((stack.root / "nodes" / "dispatcher.pid").read_text().split()[0])
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        attempts = asyncio.run(tenant_attempts(stack.ports["amqp"]))
        stack.run("down")
        served.wait(timeout=60)
    finally:
        served.kill()
    assert "billing-consumer (billing.*)" in stack.serve_log()
    assert attempts["bind billing.#"] == "bound"
    assert "ACCESS_REFUSED" in attempts["bind payments.#"]
    assert "ACCESS_REFUSED" in attempts["publish a payments event"]
    # The node counts an event only from a user granted its job: each tenant its own prefix.
    (event_users,) = [e for e in environ if e.startswith("DISPATCHER_EVENT_USERS=")]
    grants = Settings(event_users=event_users.partition("=")[2]).event_grants()
    assert {(g.user, g.namespace, g.prefix) for g in grants} == {
        ("guest", None, None),
        ("billing-consumer", None, "billing"),
        ("payments-consumer", None, "payments"),
    }
