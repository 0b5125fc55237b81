"""A flood of random bearer tokens against a real node process: every one is refused 401 from the
keys the node holds in memory, while /healthz and a stored key created just before the flood keep
answering within their usual time (that a token costs no query: tests/integration/test_gate.py)."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.dispatcher_process import DispatcherProcess
from dispatcher.auth import api_keys
from dispatcher.store.api_keys import KeyStore
from dispatcher.store.db import Database
from tests.support.process import served

# serial: it times answers while a flood of requests weighs on the node.
pytestmark = [pytest.mark.e2e, pytest.mark.serial]
ADMIN = "flood-admin-0123456789abcdef"
FLOOD_S = 3.0
CONCURRENCY = 64


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    yield from served(
        tmp_path,
        database_url,
        amqp_url,
        env={"DISPATCHER_API_KEYS": f"{ADMIN}:admin"},
        api_key=ADMIN,
    )


async def timed(http: httpx.AsyncClient, path: str, token: str | None) -> tuple[int, float]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    answer = await http.get(path, headers=headers)
    return answer.status_code, time.monotonic() - started


async def sample(http: httpx.AsyncClient, token: str, until: float) -> list[tuple[int, float]]:
    """/healthz and a known key's page, every 100 ms until ``until``."""
    samples = []
    while time.monotonic() < until:
        samples.append(await timed(http, "/healthz", None))
        samples.append(await timed(http, "/v1/jobs?limit=1", token))
        await asyncio.sleep(0.1)
    return samples


async def flood(url: str, until: float) -> list[int]:
    """Random tokens, CONCURRENCY at a time, until ``until``: their statuses."""
    statuses: list[int] = []
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=10) as http:

        async def one_stream() -> None:
            while time.monotonic() < until:
                token = f"dk_{uuid.uuid4().hex}{uuid.uuid4().hex}"
                statuses.append((await timed(http, "/v1/jobs", token))[0])

        await asyncio.gather(*(one_stream() for _ in range(CONCURRENCY)))
    return statuses


async def test_a_token_flood_costs_no_query_and_locks_no_key_out(
    dispatcher: DispatcherProcess, database_url: str
) -> None:
    db = Database(database_url, min_size=1, max_size=1, timeout_s=5)
    await db.open()
    try:
        _, token = await KeyStore(db).create(scope=api_keys.Scope.PRODUCER, name="fresh")
    finally:
        await db.close()
    async with httpx.AsyncClient(base_url=dispatcher.url, timeout=10) as http:
        await asyncio.sleep(0.5)  # the key's notice reached the node
        usual = [
            await timed(http, path, token)
            for _ in range(5)
            for path in ("/healthz", "/v1/jobs?limit=1")
        ]
        assert all(status == 200 for status, _ in usual), usual
        until = time.monotonic() + FLOOD_S
        statuses, samples = await asyncio.gather(
            flood(dispatcher.url, until), sample(http, token, until)
        )
    usual_s = statistics.median(took for _, took in usual)
    print(
        f"{len(statuses)} random tokens in {FLOOD_S} s; usual answer {usual_s * 1000:.1f} ms,"
        f" slowest under the flood {max(took for _, took in samples) * 1000:.1f} ms"
    )
    assert len(statuses) > 500, len(statuses)  # a flood, not a trickle
    assert set(statuses) == {401}, sorted(set(statuses))
    assert all(status == 200 for status, _ in samples), samples
    assert max(took for _, took in samples) < max(0.5, 20 * usual_s), samples
