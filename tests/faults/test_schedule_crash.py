"""kill -9 of the dispatcher while a recurring schedule runs, then a restart: every occurrence
still arrives (jobs are stored before the schedule advances, under per-occurrence idempotency
keys); duplicates only of the jobs whose publish the kill cut off (at-least-once)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from tests.support import occurrences
from tests.support.process import served
from tests.support.waiting import eventually

pytestmark = pytest.mark.faults

SECONDS = 20


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    env = {
        **FAST_LEASE,
        "DISPATCHER_SCHEDULE_POLL_S": "0.5",
        "DISPATCHER_SCHEDULE_AHEAD_S": "3",
        "DISPATCHER_SCHEDULE_MIN_INTERVAL_S": "1",  # a schedule every second, for a short test
    }
    yield from served(tmp_path, database_url, amqp_url, env=env)


async def test_kill_9_mid_schedule_misses_no_occurrence(
    dispatcher: DispatcherProcess, collector: Collector
) -> None:
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    end = start + timedelta(seconds=SECONDS - 1)
    await occurrences.create(
        dispatcher.url,
        {
            "name": "crashy",
            "interval_s": 1,
            "start_at": start.isoformat(),
            "end_at": end.isoformat(),
            "missed": "all",
            "job": {"routing_key": "faults.crashy", "payload": {}},
        },
    )
    expected = [start + timedelta(seconds=i) for i in range(SECONDS)]
    await eventually(lambda: len(occurrences.arrivals(collector, "crashy")) >= 8, 30)
    dispatcher.kill()
    before = len(occurrences.arrivals(collector, "crashy"))
    killed_at = datetime.now(UTC)
    dispatcher.start()
    restarted_in = (datetime.now(UTC) - killed_at).total_seconds()
    await collector.wait_for_count(SECONDS, SECONDS + 30)
    await collector.settle(4.0)  # past the lease: a cut-off claim fires again by now
    result = occurrences.reckon(collector, "crashy", expected)
    ledger = result.ledger
    print(f"\nkill -9 after {before}/{SECONDS} occurrences, back in {restarted_in:.1f}s; {result}")
    assert before < SECONDS, "the kill landed while the schedule was running"
    assert ledger.lost == []
    assert result.unexpected == []
    assert ledger.early == []
    # At-least-once: only a claim in flight at the kill may arrive twice (one per second here).
    assert sum(count - 1 for count in ledger.duplicated.values()) <= 2
