"""PostgreSQL crashed and restarted while producers submit and the dispatcher fires: POSTs during
the outage answer 503 within the database timeout, every job answered 2xx is delivered, and
firing resumes by itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from devstack.ports import reserve_port
from devstack.postgres import PostgresServer
from devstack.spread import schedule_spread
from tests.support.producers import Submissions, submit_steadily
from tests.support.waiting import eventually

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
