"""PostgreSQL crashed and restarted while producers submit and the dispatcher fires: POSTs during
the outage answer 503 within the database timeout, every job answered 2xx is delivered, and
firing resumes by itself."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from devstack.ports import free_port
from devstack.postgres import PostgresServer
from tests.support.collector import Collector
from tests.support.nodes import WRITE
from tests.support.process import FAST_LEASE, DispatcherProcess
from tests.support.schedule import run_at_s, schedule_spread
from tests.support.waiting import eventually

pytestmark = pytest.mark.faults

DB_TIMEOUT_S = 2.0
OUTAGE_S = 4.0


@dataclass
class Submissions:
    """What a steady producer saw: the jobs answered 2xx, and how each refusal was answered."""

    accepted: dict[str, float] = field(default_factory=dict)
    refused: list[tuple[int, float]] = field(default_factory=list)  # (status, seconds to answer)


async def submit_steadily(url: str, seen: Submissions, stop: asyncio.Event, workers: int) -> None:
    """Single POSTs, due 0.5-3 s ahead, from ``workers`` concurrent producers until ``stop``."""

    async def producer(number: int, http: httpx.AsyncClient) -> None:
        sent = 0
        while not stop.is_set():
            body = {"routing_key": "e2e.work", "payload": sent, "delay_ms": 500 + sent % 2500}
            started = time.monotonic()
            response = await http.post("/v1/jobs", json=body)
            answered_in = time.monotonic() - started
            if response.is_success:
                job = response.json()
                seen.accepted[job["id"]] = run_at_s(job)
            else:
                seen.refused.append((response.status_code, answered_in))
            sent += 1
            await asyncio.sleep(0.02)  # a steady trickle, not a load test

    async with (
        httpx.AsyncClient(base_url=url, timeout=30, headers=WRITE) as http,
        asyncio.TaskGroup() as group,
    ):
        for number in range(workers):
            group.create_task(producer(number, http), name=f"producer-{number}")


async def test_postgres_restart_during_submission_and_firing_loses_no_accepted_job(
    tmp_path: Path, own_postgres: PostgresServer, amqp_url: str, collector: Collector
) -> None:
    process = DispatcherProcess(
        tmp_path,
        port=free_port(),
        env={
            "DISPATCHER_DATABASE_URL": own_postgres.dsn("dispatcher"),
            "DISPATCHER_AMQP_URL": amqp_url,
            "DISPATCHER_DB_TIMEOUT_S": str(DB_TIMEOUT_S),
            **FAST_LEASE,
        },
    )
    process.start()
    try:
        firing = await schedule_spread(process.url, 2000, over_s=12, batch=1000)
        seen = Submissions()
        stop = asyncio.Event()
        producers = asyncio.create_task(submit_steadily(process.url, seen, stop, workers=4))
        await eventually(lambda: len(collector.deliveries) >= 400, 40)
        await asyncio.to_thread(own_postgres.kill)  # immediate shutdown: a crash
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(own_postgres.start)
        accepted_before_restart = len(seen.accepted)
        await eventually(lambda: len(seen.accepted) >= accepted_before_restart + 50, 30)
        stop.set()
        await producers
        everything = {**firing, **seen.accepted}
        ledger = await collector.reckon(everything, deadline_s=90, quiet_s=1.5)
        slowest = max((answered_in for _, answered_in in seen.refused), default=0.0)
        print(
            f"\nPostgreSQL crashed for {OUTAGE_S:.0f}s: {len(seen.accepted)} single POSTs "
            f"answered 2xx, {len(seen.refused)} refused (slowest refusal {slowest:.2f}s); {ledger}"
        )
        assert seen.refused, "some POSTs met the outage"
        assert {status for status, _ in seen.refused} == {503}
        assert slowest < DB_TIMEOUT_S + 3  # a behaviour bound: the database timeout, not a hang
        assert ledger.lost == []
        assert ledger.early == []
    finally:
        print(process.logs(40))
        process.stop()
