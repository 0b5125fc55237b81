"""PostgreSQL crashed and restarted while producers submit and the dispatcher fires: POSTs during
the outage answer 503 within the database timeout, every job answered 2xx is delivered, and
firing resumes by itself. Meanwhile ``/readyz`` names the loops the outage holds up, whether
their error reached the supervisor (the LISTEN connection) or they keep retrying inside and
report it (events held unacked until they are recorded), and stops naming them after."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from consumers_sdk.reporter import EventReporter
from devstack.collector import Collector
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from devstack.ports import reserve_port
from devstack.postgres import PostgresServer
from devstack.spread import schedule_spread
from tests.support.producers import Submissions, submit_steadily
from tests.support.waiting import eventually, until

pytestmark = pytest.mark.faults

DB_TIMEOUT_S = 2.0
OUTAGE_S = 4.0


async def test_postgres_restart_during_submission_and_firing_loses_no_accepted_job(
    tmp_path: Path, own_postgres: PostgresServer, amqp_url: str, collector: Collector
) -> None:
    process = DispatcherProcess(
        tmp_path,
        port=reserve_port(),
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


async def readyz(http: httpx.AsyncClient) -> tuple[int, dict[str, Any]]:
    response = await http.get("/readyz")
    return response.status_code, response.json()


async def test_loops_held_up_by_postgres_show_degraded_in_readyz_until_it_is_back(
    tmp_path: Path, own_postgres: PostgresServer, amqp_url: str
) -> None:
    process = DispatcherProcess(
        tmp_path,
        port=reserve_port(),
        env={
            "DISPATCHER_DATABASE_URL": own_postgres.dsn("dispatcher"),
            "DISPATCHER_AMQP_URL": amqp_url,
            "DISPATCHER_DB_TIMEOUT_S": str(DB_TIMEOUT_S),
            # Every loop that reads PostgreSQL looks within a few seconds: the loader every
            # lookahead / 4, the counts every stats interval, the sweeper every lease / 2.
            "DISPATCHER_LOOKAHEAD_S": "8",
            "DISPATCHER_STATS_INTERVAL_S": "2",
            "DISPATCHER_LEASE_S": "4",
        },
    )
    process.start()
    reporter = EventReporter(amqp_url, group="outage", consumer="test")
    answers: list[tuple[int, dict[str, Any]]] = []
    # Those the error reaches (restarted by the supervisor), then those that keep what they
    # hold and retry inside, reporting themselves.
    restarted = {"notices", "loader", "sweeper"}
    reporting = {
        "events",
        "housekeeping",
        "vacuum-watch",
        "schedules",
        "dependents",
        "bulk-actions",
    }
    held_up = restarted | reporting
    try:
        async with httpx.AsyncClient(base_url=process.url, timeout=10) as http:

            async def degraded() -> dict[str, str]:
                answers.append(await readyz(http))
                return dict(answers[-1][1].get("degraded", {}))

            async def all_held_up() -> bool:
                return held_up <= (await degraded()).keys()

            async def all_well() -> bool:
                return not held_up & (await degraded()).keys() and answers[-1][0] == 200

            assert await all_well()
            assert "degraded" not in answers[-1][1]
            await asyncio.to_thread(own_postgres.stop)
            # An event to record: the events loop holds it unacked and retries inside.
            reporter.open()
            reporter.report(
                job_id=str(uuid.uuid4()), routing_key="outage.test", attempt=1, outcome="succeeded"
            )
            await until(all_held_up, 30)
            status, answer = answers[-1]
            assert status == 503
            for loop in restarted:
                assert "StoreUnavailable" in answer["degraded"][loop], loop
            assert answer["degraded"]["events"].startswith("recording: StoreUnavailable")
            for loop in reporting:
                assert ": StoreUnavailable" in answer["degraded"][loop], loop

            await asyncio.to_thread(own_postgres.start)
            await until(all_well, 60)
            assert answers[-1][1]["checks"]["loops"] is True
    finally:
        await reporter.close(timeout_s=1)
        print(f"last /readyz answers: {answers[-3:]}")
        print(process.logs(40))
        process.stop()
