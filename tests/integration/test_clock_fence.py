"""The claim's clock fence on a real node: a node whose time jumps ahead (its time source stepped
under it, as no healthy monotonic clock does) pops jobs that are not due; PostgreSQL's clock, read
by the claim, refuses them (put back and counted), or, should the jump land while a claim is out,
the claim's reading decides when its jobs are published. Either way the node measures its time
again, and every job still arrives no earlier than its run_at (measured by this process's
clock)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from devstack.collector import Collector
from tests.support.nodes import client, running_node
from tests.support.waiting import eventually

JOBS = 120
OVER_S = 6.0
JUMP_S = 3.0  # the node's time jumps this far ahead while the jobs fall due


class SteppedMonotonic:
    def __init__(self) -> None:
        self.ahead_s = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead_s


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} "))


async def test_a_node_whose_time_jumps_ahead_fires_nothing_early(
    database_url: str, amqp_url: str, collector: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    mono = SteppedMonotonic()
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        shard_count=8,
        # No periodic sample in the test's time: only a fenced claim makes the node measure again.
        clock_sample_s=600,
        mono=mono,
    ) as node:
        first = time.time() + 1.0
        jobs = [
            {
                "routing_key": "clock.fence",
                "payload": {"n": n},
                "run_at": datetime.fromtimestamp(first + OVER_S * n / JOBS, UTC).isoformat(),
            }
            for n in range(JOBS)
        ]
        async with client(node) as http:
            response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
        assert response.status_code == 201, response.text
        accepted = {
            job["id"]: datetime.fromisoformat(job["run_at"]).timestamp()
            for job in response.json()["jobs"]
        }
        await eventually(lambda: len(collector.deliveries) >= JOBS // 4, 30)
        mono.ahead_s = JUMP_S
        ledger = await collector.reckon(accepted, deadline_s=30)
        rendered = node.core.metrics.render().decode()
        state = node.core.timekeeper.describe()
    fenced = metric(rendered, "dispatcher_claims_fenced_early_total")
    by_reading = [r for r in caplog.records if "published by that reading" in r.getMessage()]
    print(
        f"\nthe node's time jumped {JUMP_S} s ahead mid-firing: {ledger}; {fenced:.0f} jobs "
        f"fenced, {len(by_reading)} claims published by the claim's reading; clock {state}"
    )
    assert ledger.lost == []
    assert ledger.early == []
    assert fenced > 0 or by_reading
    assert state["steps"] == 1
