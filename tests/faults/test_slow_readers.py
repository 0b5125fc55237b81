"""Clients that ask for large answers and never read them, against a real dispatcher process: the
node holds a bounded amount for them, closes them once they stop taking bytes, counts each close,
and keeps answering /healthz and keyed requests meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from devstack.dispatcher_process import DispatcherProcess
from tests.support.process import served

# serial: it times answers while hundreds of connections weigh on the node.
pytestmark = [pytest.mark.faults, pytest.mark.serial]

ADMIN = "admin-token-0123456789"
PRODUCER = "producer-token-0123456789"
PRODUCER_AUTH = {"authorization": f"Bearer {PRODUCER}"}
PAGE_REQUEST = (
    b"GET /v1/jobs?limit=1000 HTTP/1.1\r\nHost: node\r\nauthorization: Bearer %s\r\n\r\n"
    % PRODUCER.encode()
)
WRITE_TIMEOUT_S = 2.0  # the write deadline of these tests' nodes
MIB = 1024 * 1024
ANSWER_S = 1.0  # /healthz and a keyed request answer within this while the clients weigh
BUNDLE = "/docs-assets/swagger-ui-bundle.js"
ATTACK_S = 2.0  # the attackers' connections come in over this long
WINDOW_S = 12.0  # how long the node is watched at most


@contextlib.contextmanager
def node(
    tmp_path: Path, database_url: str, amqp_url: str, **env: str
) -> Iterator[DispatcherProcess]:
    settings = {
        "DISPATCHER_API_KEYS": f"{ADMIN}:admin,{PRODUCER}:producer",
        "DISPATCHER_HTTP_WRITE_TIMEOUT_S": str(WRITE_TIMEOUT_S),
        **{f"DISPATCHER_{name.upper()}": value for name, value in env.items()},
    }
    yield from served(tmp_path, database_url, amqp_url, env=settings, api_key=ADMIN)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def queued_bytes(port: int) -> int:
    """What the kernel holds unsent on the node's side of its HTTP connections (closed ones it
    still tries to deliver included): the tx_queue column of /proc/net/tcp."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            total += int(fields[4].split(":")[0], 16)
    return total


def held_bytes(dispatcher: DispatcherProcess) -> int:
    """The node's RSS plus what the kernel holds for its clients."""
    return rss_bytes(dispatcher.pid) + queued_bytes(dispatcher.port)


async def never_reading(
    port: int, request: bytes, count: int, sockets: list[socket.socket]
) -> None:
    """Open COUNT connections over ``ATTACK_S`` that send REQUEST and never read a byte of the
    answer (a small receive buffer: the client's kernel takes little of it)."""
    loop = asyncio.get_running_loop()
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sockets.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, request)
        await asyncio.sleep(ATTACK_S / count)


async def attacked(dispatcher: DispatcherProcess, request: bytes, count: int) -> Watch:
    """What the node does while COUNT clients send REQUEST and never read."""
    sockets: list[socket.socket] = []
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(never_reading(dispatcher.port, request, count, sockets))
            seen = group.create_task(watch(dispatcher, ("write_timeout", "write_budget"), count))
    finally:
        for sock in sockets:
            sock.close()
    return seen.result()


async def store_big_jobs(dispatcher: DispatcherProcess, count: int) -> int:
    """COUNT jobs of 200 KB each, due in a day; the size of a page of them all."""
    async with httpx.AsyncClient(
        base_url=dispatcher.url, headers=PRODUCER_AUTH, timeout=30
    ) as http:
        for first in range(0, count, 10):
            job = {"routing_key": "big.page", "delay_ms": 86_400_000, "payload": "x" * 200_000}
            stored = await http.post(
                "/v1/jobs/batch", json={"jobs": [job] * min(10, count - first)}
            )
            assert stored.status_code == 201, stored.text
        return len((await http.get("/v1/jobs", params={"limit": 1000})).content)


def refused(metrics: str, *reasons: str) -> int:
    total = 0.0
    for reason in reasons:
        found = re.search(rf'dispatcher_http_refused_total{{reason="{reason}"}} (\S+)', metrics)
        total += float(found.group(1)) if found else 0.0
    return int(total)


@dataclass
class Watch:
    """What a watcher saw while the slow readers weighed on the node."""

    held_before: int  # the node's RSS and its sockets' kernel send queues
    held_peak: int = 0
    rss_peak: int = 0
    queued_peak: int = 0
    healthz_s: list[float] = field(default_factory=list)
    keyed_s: list[float] = field(default_factory=list)
    statuses: set[int] = field(default_factory=set)
    closed: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def growth(self) -> int:
        return self.held_peak - self.held_before

    def report(self, name: str) -> str:
        return (
            f"\n{name}: RSS and send queues +{self.growth / MIB:.1f} MiB (RSS peak "
            f"{self.rss_peak / MIB:.1f} MiB, queues peak {self.queued_peak / MIB:.1f} MiB, before "
            f"{self.held_before / MIB:.1f} MiB); "
            f"{len(self.healthz_s)} /healthz, slowest {max(self.healthz_s):.3f}s; "
            f"{len(self.keyed_s)} keyed, slowest {max(self.keyed_s):.3f}s; "
            f"statuses {sorted(self.statuses)}; closed {self.by_reason}"
        )


async def watch(dispatcher: DispatcherProcess, reasons: tuple[str, ...], closes: int) -> Watch:
    """Probe /healthz and ``POST /v1/jobs`` (a producer's key) and sample what the node holds,
    until ``closes`` connections were counted under ``reasons`` or ``WINDOW_S`` passed."""
    seen = Watch(held_before=held_bytes(dispatcher))
    seen.held_peak = seen.held_before
    job = {"routing_key": "slow.readers", "delay_ms": 86_400_000, "payload": {"n": 1}}
    ends = time.monotonic() + WINDOW_S
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            rss, queued = rss_bytes(dispatcher.pid), queued_bytes(dispatcher.port)
            seen.held_peak = max(seen.held_peak, rss + queued)
            seen.rss_peak = max(seen.rss_peak, rss)
            seen.queued_peak = max(seen.queued_peak, queued)
            await asyncio.sleep(0.05)

    async with (
        httpx.AsyncClient(base_url=dispatcher.url, timeout=10) as http,
        httpx.AsyncClient(base_url=dispatcher.url, headers=dispatcher.auth, timeout=10) as admin,
        asyncio.TaskGroup() as group,
    ):
        group.create_task(sample())
        while time.monotonic() < ends and seen.closed < closes:
            started = time.monotonic()
            health = await http.get("/healthz")
            seen.healthz_s.append(time.monotonic() - started)
            started = time.monotonic()
            keyed = await http.post("/v1/jobs", json=job, headers=PRODUCER_AUTH)
            seen.keyed_s.append(time.monotonic() - started)
            seen.statuses |= {health.status_code, keyed.status_code}
            metrics = (await admin.get("/metrics")).text
            seen.closed = refused(metrics, *reasons)
            seen.by_reason = {reason: refused(metrics, reason) for reason in reasons}
            await asyncio.sleep(0.1)
        done.set()
    return seen


async def test_anonymous_clients_that_never_read_the_swagger_bundle_are_bounded_and_closed(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    count = 200
    with node(tmp_path, database_url, amqp_url) as dispatcher:
        request = b"GET %s HTTP/1.1\r\nHost: node\r\n\r\n" % BUNDLE.encode()
        seen = await attacked(dispatcher, request, count)
    print(seen.report("swagger bundle"))
    assert seen.statuses == {200, 201}
    assert max(seen.healthz_s) < ANSWER_S
    assert max(seen.keyed_s) < ANSWER_S
    assert seen.closed >= count
    assert seen.by_reason["write_timeout"] > 0
    # Before these bounds: +297 MiB (290 MiB of it in the kernel's send queues), none closed.
    assert seen.growth < 128 * MIB


async def test_keyed_clients_that_never_read_big_pages_are_bounded_and_closed(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    count = 100
    with node(tmp_path, database_url, amqp_url) as dispatcher:
        # A page ends past DISPATCHER_MAX_PAGE_BYTES (4 MiB) of payloads: 21 of these jobs.
        assert await store_big_jobs(dispatcher, 40) > 4_000_000
        seen = await attacked(dispatcher, PAGE_REQUEST, count)
    print(seen.report("pages of 4 MB"))
    assert seen.statuses == {200, 201}
    assert max(seen.healthz_s) < ANSWER_S
    assert max(seen.keyed_s) < ANSWER_S
    assert seen.closed >= count
    assert seen.by_reason["write_budget"] > 0
    # Before these bounds: +686 MiB (RSS +402 MiB, send queues 283 MiB), none closed.
    assert seen.growth < 192 * MIB


async def test_a_slow_client_that_keeps_reading_gets_a_page_longer_than_the_write_deadline(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    with node(tmp_path, database_url, amqp_url, http_write_timeout_s="1") as dispatcher:
        size = await store_big_jobs(dispatcher, 10)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, ("127.0.0.1", dispatcher.port))
        await loop.sock_sendall(sock, PAGE_REQUEST)
        received = b""
        started = time.monotonic()
        with sock:
            while len(received.partition(b"\r\n\r\n")[2]) < size:
                chunk = await loop.sock_recv(sock, 32 * 1024)
                assert chunk, f"closed after {len(received)} bytes"
                received += chunk
                await asyncio.sleep(0.05)  # about 600 KiB a second: 2 MB takes longer than 1 s
        took_s = time.monotonic() - started
        async with httpx.AsyncClient(base_url=dispatcher.url, headers=dispatcher.auth) as admin:
            metrics = (await admin.get("/metrics")).text
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert len(json.loads(body)["jobs"]) == 10
    assert took_s > 2
    assert refused(metrics, "write_timeout", "write_budget") == 0


async def test_past_the_unsent_budget_a_page_gets_503_until_a_stalled_client_is_closed(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    budget = 1024 * 1024  # under one page: a page goes out only while nothing else is held
    with node(tmp_path, database_url, amqp_url, http_max_unsent_bytes=str(budget)) as dispatcher:
        await store_big_jobs(dispatcher, 10)
        stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", dispatcher.port))
        stalled.sendall(PAGE_REQUEST)
        assert stalled.recv(12) == b"HTTP/1.1 200"  # its answer has begun; it reads no more
        async with (
            httpx.AsyncClient(base_url=dispatcher.url, headers=PRODUCER_AUTH) as http,
            httpx.AsyncClient(base_url=dispatcher.url, headers=dispatcher.auth) as admin,
        ):
            busy = await http.get("/v1/jobs", params={"limit": 1000})
            await asyncio.sleep(1.5)  # the first client has now taken nothing for over a second
            served = await http.get("/v1/jobs", params={"limit": 1000})
            metrics = (await admin.get("/metrics")).text
        stalled.close()
    assert busy.status_code == 503, busy.text
    assert busy.json()["error"] == "busy"
    assert busy.headers["retry-after"] == "1"
    assert served.status_code == 200
    assert len(served.json()["jobs"]) == 10
    assert refused(metrics, "write_budget") == 2  # the 503, then the stalled client closed
