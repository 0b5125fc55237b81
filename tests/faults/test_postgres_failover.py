"""The PostgreSQL primary killed (kill -9) and its synchronous standby promoted, as a failover
manager would, while producers submit and the dispatcher fires: every job answered 2xx before or
after the kill is delivered, POSTs during the switch answer 503, and the node, given both hosts
in one URL, reconnects to the promoted server by itself (its pool and its LISTEN connection)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from devstack.ports import free_port
from devstack.postgres_standby import PrimaryWithStandby
from tests.support.collector import Collector
from tests.support.process import FAST_LEASE, DispatcherProcess
from tests.support.producers import Submissions, submit_steadily
from tests.support.recovery import assert_serving_again
from tests.support.schedule import schedule_spread
from tests.support.waiting import eventually, until

pytestmark = pytest.mark.faults

DB_TIMEOUT_S = 2.0
# The node's LISTEN connection for due notices (its application_name) on the server queried.
LISTENERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dispatcher-node-notices'"
)
DETECTION_S = 3.0  # a failover manager's time to notice the primary is gone


async def test_primary_killed_and_standby_promoted_loses_no_accepted_job(
    tmp_path: Path, pg_pair: PrimaryWithStandby, amqp_url: str, collector: Collector
) -> None:
    process = DispatcherProcess(
        tmp_path,
        port=free_port(),
        env={
            "DISPATCHER_DATABASE_URL": pg_pair.dsn("dispatcher"),
            "DISPATCHER_AMQP_URL": amqp_url,
            "DISPATCHER_DB_TIMEOUT_S": str(DB_TIMEOUT_S),
            **FAST_LEASE,
        },
    )
    process.start()
    try:
        firing = await schedule_spread(process.url, 2000, over_s=15, batch=1000)
        seen = Submissions()
        stop = asyncio.Event()
        producers = asyncio.create_task(submit_steadily(process.url, seen, stop, workers=4))
        await eventually(lambda: len(collector.deliveries) >= 400, 40)
        accepted_before_kill = dict(seen.accepted)
        killed_at = time.time()
        await asyncio.to_thread(pg_pair.kill_primary)
        await asyncio.sleep(DETECTION_S)
        await asyncio.to_thread(pg_pair.promote)
        promoted_at = time.time()
        refused_during_switch = len(seen.refused)
        accepted_after_promote = len(seen.accepted)
        await eventually(lambda: len(seen.accepted) >= accepted_after_promote + 50, 60)
        stop.set()
        await producers
        everything = {**firing, **seen.accepted}
        ledger = await collector.reckon(everything, deadline_s=120, quiet_s=1.5)
        firsts = [min(d.received_at for d in got) for got in collector.deliveries.values()]
        resumed_at = min((at for at in firsts if at > promoted_at), default=float("nan"))
        print(
            f"\nprimary killed, standby promoted {DETECTION_S:.0f}s later: "
            f"{len(accepted_before_kill)} single POSTs answered 2xx before the kill, "
            f"{len(seen.accepted)} in all, {len(seen.refused)} refused "
            f"(statuses {sorted({s for s, _ in seen.refused})}); first job fired after the "
            f"promotion {resumed_at - killed_at:.2f}s after the kill; {ledger}"
        )
        assert refused_during_switch > 0, "some POSTs met the switch"
        assert {status for status, _ in seen.refused} == {503}
        assert ledger.lost == []
        assert ledger.early == []
        assert process.is_running(), process.logs(80)

        async def listening_on_promoted() -> bool:
            sessions = await asyncio.to_thread(pg_pair.standby.sql, LISTENERS, "dispatcher")
            return int(sessions) == 1

        await until(listening_on_promoted, 60)  # due notices reach the node again
        await assert_serving_again(process.url, collector)
    finally:
        print(process.logs(60))
        process.stop()
