"""A recurring schedule end to end: a real dispatcher process makes each occurrence a job, and an
independent AMQP consumer counts what arrives."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import DispatcherProcess
from tests.support import occurrences
from tests.support.process import served

# Twenty occurrences, made into jobs 3 s ahead (the default is 10 s): the run crosses that window
# six times, more than a minute at the default did, in a third of the time.
SECONDS = 12
ENV = {
    "DISPATCHER_SCHEDULE_POLL_S": "0.5",
    "DISPATCHER_SCHEDULE_AHEAD_S": "3",
    "DISPATCHER_SCHEDULE_MIN_INTERVAL_S": "1",  # a schedule every second, for a short test
}


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    yield from served(tmp_path, database_url, amqp_url, env=ENV)


async def test_every_second_for_twelve_seconds_delivers_each_occurrence_exactly_once(
    dispatcher: DispatcherProcess, collector: Collector
) -> None:
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    end = start + timedelta(seconds=SECONDS - 1)  # inclusive: exactly SECONDS occurrences
    await occurrences.create(
        dispatcher.url,
        {
            "name": "tick",
            "interval_s": 1,
            "start_at": start.isoformat(),
            "end_at": end.isoformat(),
            "job": {"routing_key": "e2e.tick", "payload": {"kind": "tick"}},
        },
    )
    expected = [start + timedelta(seconds=i) for i in range(SECONDS)]
    await collector.wait_for_count(SECONDS, SECONDS + 30)
    await collector.settle(2.0)
    result = occurrences.reckon(collector, "tick", expected)
    ledger = result.ledger
    print(f"\nevery second for {SECONDS}s: {result}")
    assert ledger.lost == []
    assert result.unexpected == []
    assert ledger.early == []
    assert ledger.duplicated == {}  # no fault: at-least-once must not show here
    assert ledger.once == SECONDS
