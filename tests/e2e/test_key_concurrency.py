"""Many clients submitting the same few idempotency keys at once (keep, replace, extend, keys let go
of once dispatched) against a dispatcher process that fires them meanwhile: at every look at
PostgreSQL a key names one pending job at most, every job created is delivered, none early, each
with a payload some request gave it, and the node stays up."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import asyncpg
import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devstack.collector import Collector
from devstack.dispatcher_process import DispatcherProcess
from tests.support.nodes import WRITE
from tests.support.process import served

pytestmark = pytest.mark.e2e

CLIENTS = 16
KEYS = 3


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    yield from served(tmp_path, database_url, amqp_url)


@pytest.fixture
async def collector(amqp_url: str) -> AsyncIterator[Collector]:
    consumer = Collector(amqp_url, binding="race.#")
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class Submit:
    client: int
    key: int
    how: str
    delay_ms: int
    release: bool


SUBMITS = st.lists(
    st.builds(
        Submit,
        client=st.integers(0, CLIENTS - 1),
        key=st.integers(0, KEYS - 1),
        how=st.sampled_from(["keep", "replace", "extend"]),
        delay_ms=st.integers(0, 1500),
        release=st.booleans(),
    ),
    min_size=40,
    max_size=160,
)

# Every pending job of a key, held or let go of (a released key stays in released_key).
PENDING_BY_KEY = """
SELECT coalesce(idempotency_key, released_key) AS key, count(*) AS pending FROM jobs
WHERE state IN ('scheduled', 'waiting') AND coalesce(idempotency_key, released_key) LIKE $1
GROUP BY 1
"""


async def watch(database_url: str, prefix: str, stop: asyncio.Event) -> tuple[int, int]:
    """(the most pending jobs one key had at any look, how many looks) until STOP."""
    connection = await asyncpg.connect(database_url)
    most, looks = 0, 0
    try:
        while not stop.is_set():
            rows = await connection.fetch(PENDING_BY_KEY, f"{prefix}%")
            most = max([most, *(row["pending"] for row in rows)])
            looks += 1
            await asyncio.sleep(0.005)
    finally:
        await connection.close()
    return most, looks


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(submits=SUBMITS, seed=st.integers(0, 2**16))
async def test_a_key_names_one_pending_job_at_most_under_concurrent_submits(
    dispatcher: DispatcherProcess,
    database_url: str,
    collector: Collector,
    submits: list[Submit],
    seed: int,
) -> None:
    prefix = f"race-{seed}-{time.monotonic_ns()}-"
    answers: list[tuple[int, dict[str, object]]] = []  # (submit index, answer)

    async def client(index: int) -> None:
        mine = [(i, s) for i, s in enumerate(submits) if s.client == index]
        async with httpx.AsyncClient(base_url=dispatcher.url, headers=WRITE, timeout=30) as http:
            for i, submit in mine:
                body = {
                    "routing_key": "race.job",
                    "payload": {"submit": i},
                    "delay_ms": submit.delay_ms,
                    "idempotency_key": f"{prefix}{submit.key}",
                    "on_existing": submit.how,
                    "release_key": "dispatched" if submit.release else "never",
                }
                answer = await http.post("/v1/jobs", json=body)
                assert answer.status_code in (200, 201), answer.text
                answers.append((i, answer.json()))
                await asyncio.sleep(random.Random(seed + i).random() * 0.02)

    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(database_url, prefix, stop))
    await asyncio.gather(*(client(index) for index in range(CLIENTS)))
    created = {str(a["id"]) for _, a in answers if a["outcome"] == "created"}
    assert await collector.wait_for(created, 30) == set()
    await collector.settle(0.5)
    stop.set()
    most, looks = await watcher

    assert most <= 1, f"a key named {most} pending jobs at once"
    assert looks > 10
    outcomes = {str(a["outcome"]) for _, a in answers}
    assert outcomes <= {"created", "kept", "replaced", "extended", "refused"}
    given_to: dict[str, set[int]] = {}  # job id -> the submits whose payload it may carry
    for i, answer in answers:
        if answer["outcome"] in ("created", "replaced"):
            given_to.setdefault(str(answer["id"]), set()).add(i)
    mine = {job_id for job_id in collector.deliveries if job_id in given_to}
    assert mine == created  # every job created delivered, and no other
    duplicates = 0  # at-least-once: counted, not refused
    async with httpx.AsyncClient(base_url=dispatcher.url, headers=WRITE) as http:
        for job_id in created:
            [delivery, *again] = collector.deliveries[job_id]
            duplicates += len(again)
            stored = (await http.get(f"/v1/jobs/{job_id}")).json()
            assert orjson.loads(delivery.body)["submit"] in given_to[job_id]
            run_at = datetime.fromisoformat(stored["run_at"]).timestamp()
            assert delivery.received_at >= run_at - 0.001, "delivered before its run_at"
        assert (await http.get("/readyz")).status_code == 200
    print(
        f"\n{len(submits)} submits of {KEYS} keys by {CLIENTS} clients: {len(created)} jobs "
        f"created, {duplicates} duplicates, at most {most} pending a key in {looks} looks"
    )
