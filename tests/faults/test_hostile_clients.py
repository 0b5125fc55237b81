"""Hostile HTTP clients against a real dispatcher process with API keys: connections that never
finish their request (slowloris), anonymous 16 MiB bodies, oversized headers, too many connections
or requests. The node closes what costs it, keeps answering /healthz, and fires on time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.collector import ON_TIME_S, Collector
from devstack.dispatcher_process import DispatcherProcess
from devstack.spread import schedule_spread
from tests.support.process import served
from tests.support.waiting import until

# serial: it times the node's connection deadlines from the client's side, which a loaded
# machine shifts by tenths of a second.
pytestmark = [pytest.mark.faults, pytest.mark.serial]

ADMIN = "admin-token-0123456789"
AUTH = {"authorization": f"Bearer {ADMIN}"}
DEADLINE_S = 2.0  # the header and body deadlines of these tests' nodes
SLACK_S = 15.0  # how much later than its deadline a loaded machine may close a connection
MIB = 1024 * 1024


@contextlib.contextmanager
def node(
    tmp_path: Path, database_url: str, amqp_url: str, **env: str
) -> Iterator[DispatcherProcess]:
    settings = {
        "DISPATCHER_API_KEYS": f"{ADMIN}:admin",
        "DISPATCHER_HTTP_HEADER_TIMEOUT_S": str(DEADLINE_S),
        "DISPATCHER_HTTP_BODY_TIMEOUT_S": str(DEADLINE_S),
        **{f"DISPATCHER_{name.upper()}": value for name, value in env.items()},
    }
    yield from served(tmp_path, database_url, amqp_url, env=settings, api_key=ADMIN)


async def connect(
    port: int, *, source: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the node on 127.0.0.1, from the loopback address SOURCE if given."""
    local = None if source is None else (source, 0)
    return await asyncio.open_connection("127.0.0.1", port, local_addr=local)


async def healthz_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """The status line of GET /healthz asked on an open connection."""
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
    async with asyncio.timeout(10):
        return (await reader.readline()).rstrip()


async def until_closed(reader: asyncio.StreamReader, deadline_s: float) -> bytes:
    """Everything the node sent until it closed the connection; TimeoutError if it did not."""
    received = b""
    async with asyncio.timeout(deadline_s):
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received += chunk
    return received


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def slowloris(port: int, stop: asyncio.Event, lifetimes: list[float], source: str) -> None:
    """Open a connection from SOURCE, trickle a request's headers that never end; once the node
    closes it, record how long it lived and start over, until ``stop``."""
    while not stop.is_set():
        # Read before the connect: the node's deadline starts once it accepts, which is before
        # this loop, busy with 300 of these, resumes after the connect.
        opened = time.monotonic()
        reader, writer = await connect(port, source=source)
        writer.write(b"GET /v1/jobs HTTP/1.1\r\nHost: node\r\n")
        closed = asyncio.create_task(until_closed(reader, DEADLINE_S + SLACK_S))
        with contextlib.suppress(ConnectionError):
            while not closed.done():
                await asyncio.wait([closed], timeout=0.5)
                writer.write(b"X-Slow: 1\r\n")
        await closed  # TimeoutError: the node kept a trickling connection open
        lifetimes.append(time.monotonic() - opened)
        writer.close()


async def big_body(port: int) -> tuple[bytes, int]:
    """An anonymous 16 MiB batch, sent while no answer came: (the answer, body bytes sent)."""
    reader, writer = await connect(port)
    writer.write(
        b"POST /v1/jobs/batch HTTP/1.1\r\nHost: node\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (16 * MIB)
    )
    answer = asyncio.create_task(until_closed(reader, 60))
    sent = 0
    chunk = b" " * (16 * 1024)
    with contextlib.suppress(ConnectionError):
        while not answer.done() and sent < 16 * MIB:
            await asyncio.wait([answer], timeout=1.0)  # a generous pause for the answer
            if not answer.done():
                writer.write(chunk)
                sent += len(chunk)
    received = await answer
    writer.close()
    return received, sent


async def test_slowloris_and_big_anonymous_bodies_neither_starve_healthz_nor_delay_jobs(
    tmp_path: Path, database_url: str, amqp_url: str, collector: Collector
) -> None:
    with node(tmp_path, database_url, amqp_url) as dispatcher:
        accepted = await schedule_spread(
            dispatcher.url, 2000, over_s=10, start_in_s=4, batch=500, api_key=ADMIN
        )
        rss_before = rss_bytes(dispatcher.pid)
        rss_peak = rss_before
        health: list[int] = []
        lifetimes: list[float] = []
        stop = asyncio.Event()

        async def probe() -> None:
            nonlocal rss_peak
            async with httpx.AsyncClient(base_url=dispatcher.url, timeout=10) as http:
                while not stop.is_set():
                    health.append((await http.get("/healthz")).status_code)
                    rss_peak = max(rss_peak, rss_bytes(dispatcher.pid))
                    await asyncio.sleep(0.2)

        async with asyncio.TaskGroup() as group:
            # Spread over addresses within their share of connections (a quarter of 1 024):
            # what is timed here is the deadlines, not the share.
            slow = [
                group.create_task(
                    slowloris(dispatcher.port, stop, lifetimes, f"127.0.0.{n % 3 + 10}")
                )
                for n in range(300)
            ]
            bodies = [group.create_task(big_body(dispatcher.port)) for _ in range(6)]
            group.create_task(probe())
            ledger = await collector.reckon(accepted, deadline_s=90, quiet_s=1.5)
            stop.set()
        late = [collector.deliveries[i][0].received_at - due for i, due in accepted.items()]
    print(
        f"\n{ledger}; latest {max(late):.2f}s; {len(health)} /healthz; {len(lifetimes)} slow "
        f"connections closed after {min(lifetimes):.2f}-{max(lifetimes):.2f}s; RSS "
        f"+{(rss_peak - rss_before) / MIB:.1f} MiB"
    )
    assert ledger.lost == []
    assert ledger.early == []
    assert ledger.duplicated == {}
    assert max(late) < ON_TIME_S
    assert health
    assert set(health) == {200}
    assert all(task.done() for task in slow)
    assert len(lifetimes) >= 300
    # Closed at the deadline, not before (each lifetime counted from before its connect).
    assert min(lifetimes) >= DEADLINE_S - 0.1
    for task in bodies:
        answer, sent = task.result()
        assert answer.split(b" ", 2)[1] in (b"401", b"413"), answer[:200]
        assert sent <= 256 * 1024
    assert rss_peak - rss_before < 64 * MIB


async def test_request_headers_past_64_kib_get_431_and_the_connection_is_closed(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    with node(tmp_path, database_url, amqp_url) as dispatcher:
        reader, writer = await connect(dispatcher.port)
        big = b"X-Big: " + b"a" * (70 * 1024) + b"\r\n"
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: node\r\n" + big + b"\r\n")
        answer = await until_closed(reader, 30)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


async def test_a_request_trickled_after_a_keep_alive_response_is_closed_at_the_header_deadline(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    with node(tmp_path, database_url, amqp_url, http_keepalive_s="30") as dispatcher:
        reader, writer = await connect(dispatcher.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
        first = await reader.readuntil(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200"), first
        await reader.readexactly(int(first.lower().split(b"content-length: ")[1].split(b"\r")[0]))
        answered = time.monotonic()
        closed = asyncio.create_task(until_closed(reader, DEADLINE_S + SLACK_S))
        with contextlib.suppress(ConnectionError):
            for byte in b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Slow: " + b"1" * 1000:
                if closed.done():
                    break
                writer.write(bytes([byte]))
                await asyncio.wait([closed], timeout=0.2)
        await closed
        lived = time.monotonic() - answered
        writer.close()
    assert DEADLINE_S - 0.5 <= lived < DEADLINE_S + SLACK_S


async def test_a_body_trickled_past_its_deadline_is_closed(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    with node(tmp_path, database_url, amqp_url) as dispatcher:
        reader, writer = await connect(dispatcher.port)
        writer.write(
            b"POST /v1/jobs HTTP/1.1\r\nHost: node\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\ncontent-length: 1000\r\n\r\n{" % ADMIN.encode()
        )
        started = time.monotonic()
        closed = asyncio.create_task(until_closed(reader, DEADLINE_S + SLACK_S))
        with contextlib.suppress(ConnectionError):
            while not closed.done():
                writer.write(b" ")
                await asyncio.wait([closed], timeout=0.2)
        answer = await closed
        lived = time.monotonic() - started
        writer.close()
        async with httpx.AsyncClient(base_url=dispatcher.url, headers=AUTH) as http:
            metrics = (await http.get("/metrics")).text
    assert answer == b""  # no answer: the node closed it
    assert DEADLINE_S - 0.5 <= lived < DEADLINE_S + SLACK_S
    assert 'dispatcher_http_refused_total{reason="body_timeout"} 1.0' in metrics


async def test_one_connection_past_the_cap_is_closed_at_accept(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    cap = 8
    with node(
        tmp_path,
        database_url,
        amqp_url,
        http_max_connections=str(cap),
        http_max_connections_per_client=str(cap),  # every connection here comes from 127.0.0.1
        http_header_timeout_s="60",
    ) as dispatcher:
        held = [await connect(dispatcher.port) for _ in range(cap)]
        reader, writer = await connect(dispatcher.port)
        refused = await until_closed(reader, 30)
        writer.close()
        for _, holder in held:
            holder.close()

        async def served_again() -> bool:
            async with httpx.AsyncClient(base_url=dispatcher.url, headers=AUTH) as http:
                metrics = await http.get("/metrics")
            return 'reason="too_many_connections"' in metrics.text

        await until(served_again, 30)
    assert refused == b""


async def test_one_address_past_its_share_is_closed_at_accept_while_another_is_served(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    cap, share = 8, 2  # the default share: a quarter of the cap
    hog, other = "127.0.0.3", "127.0.0.2"  # loopback addresses the node has not seen yet
    with node(
        tmp_path, database_url, amqp_url, http_max_connections=str(cap), http_header_timeout_s="60"
    ) as dispatcher:
        held = [await connect(dispatcher.port, source=hog) for _ in range(share)]
        reader, writer = await connect(dispatcher.port, source=hog)
        refused = await until_closed(reader, 30)
        writer.close()
        held_answers = [await healthz_on(*connection) for connection in held]
        transport = httpx.AsyncHTTPTransport(local_address=other)
        async with httpx.AsyncClient(
            base_url=dispatcher.url, headers=AUTH, transport=transport, timeout=10
        ) as http:
            jobs = await http.get("/v1/jobs")
            metrics = (await http.get("/metrics")).text
        for _, holder in held:
            holder.close()
    assert refused == b""  # closed at accept, as one past the node's cap is
    assert held_answers == [b"HTTP/1.1 200 OK"] * share  # the ones within the share are served
    assert jobs.status_code == 200
    assert 'dispatcher_http_refused_total{reason="too_many_connections_per_client"} 1.0' in metrics
    assert 'reason="too_many_connections"}' not in metrics


async def test_requests_past_the_cap_get_503_with_retry_after_and_healthz_still_answers(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    with node(
        tmp_path, database_url, amqp_url, http_max_requests="2", http_body_timeout_s="60"
    ) as dispatcher:
        holders = []
        for _ in range(2):  # admitted, then waiting for a body that does not come: in progress
            _, writer = await connect(dispatcher.port)
            writer.write(
                b"POST /v1/jobs HTTP/1.1\r\nHost: node\r\ncontent-type: application/json\r\n"
                b"authorization: Bearer %s\r\ncontent-length: 100\r\n\r\n{" % ADMIN.encode()
            )
            holders.append(writer)
        async with httpx.AsyncClient(base_url=dispatcher.url, headers=AUTH, timeout=10) as http:
            busy: list[httpx.Response] = []

            async def refused() -> bool:
                busy.append(await http.get("/v1/jobs"))
                return busy[-1].status_code == 503

            await until(refused, 30)
            health = await http.get("/healthz")
            for writer in holders:
                writer.close()

            async def served_again() -> bool:
                return (await http.get("/v1/jobs")).status_code == 200

            await until(served_again, 30)
    assert busy[-1].headers["retry-after"] == "1"
    assert busy[-1].json()["error"] == "busy"
    assert health.status_code == 200
