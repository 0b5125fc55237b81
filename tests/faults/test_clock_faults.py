"""Nodes whose wall clock is wrong (libfaketime in the node's process: ``tests/support/faketime``),
the way a host's is when NTP fails or an operator steps it. A node fires on PostgreSQL's clock,
measured (``timekeeper``), and turns ``delay_ms`` into a ``run_at`` with it; past
``DISPATCHER_CLOCK_MAX_OFFSET_S`` it fires nothing and says why. Early and late are measured by
this process's clock, which is the true one (PostgreSQL's, on the same host)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.collector import Collector
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from devstack.node_cluster import Cluster, start_nodes
from devstack.ports import reserve_port
from devstack.spread import schedule_spread
from tests.support.faketime import FakeClock
from tests.support.nodes import WRITE

pytestmark = pytest.mark.faults

# Lets a node 20 s off fire (on PostgreSQL's clock): what the first test shows.
LOOSE = {"DISPATCHER_CLOCK_MAX_OFFSET_S": "60"}
STORED_WITHIN_S = 0.010  # a delay_ms stored this close to the true send time plus the delay


def readyz(node: DispatcherProcess) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{node.url}/readyz", timeout=5)
    body: dict[str, Any] = response.json()
    return response.status_code, body


def metric(node: DispatcherProcess, name: str) -> float:
    text = httpx.get(f"{node.url}/metrics", timeout=5).text
    [value] = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} ")]
    return value


async def submit_delayed(
    node: DispatcherProcess, delay_ms: int, count: int
) -> tuple[dict[str, float], list[float]]:
    """COUNT jobs with DELAY_MS through NODE: id -> stored run_at, and how far each run_at is
    from the true time the request was sent plus the delay (this process's clock, before and
    after the request: a run_at between the two is exact)."""
    jobs = [
        {"routing_key": "clock.relative", "payload": {"n": n}, "delay_ms": delay_ms}
        for n in range(count)
    ]
    async with httpx.AsyncClient(timeout=30, headers=WRITE) as http:
        sent = time.time()
        response = await http.post(f"{node.url}/v1/jobs/batch", json={"jobs": jobs})
        answered = time.time()
    assert response.status_code == 201, response.text
    stored = {
        job["id"]: datetime.fromisoformat(job["run_at"]).timestamp()
        for job in response.json()["jobs"]
    }
    delay_s = delay_ms / 1000
    off = [
        0.0
        if sent + delay_s <= run_at <= answered + delay_s
        else min(abs(run_at - sent - delay_s), abs(run_at - answered - delay_s))
        for run_at in stored.values()
    ]
    return stored, off


async def test_nodes_20_s_ahead_and_behind_fire_on_postgresqls_clock(
    cluster: Cluster, collector: Collector, tmp_path: Path
) -> None:
    ahead = FakeClock(tmp_path, "+20s", name="ahead")
    behind = FakeClock(tmp_path, "-20s", name="behind")
    await asyncio.to_thread(cluster.start, "ahead", {**ahead.env, **LOOSE})
    await asyncio.to_thread(cluster.start, "behind", {**behind.env, **LOOSE})
    await asyncio.to_thread(cluster.wait_converged, {"ahead", "behind"})
    skewed = [cluster.nodes["ahead"], cluster.nodes["behind"]]

    # Absolute run_at from a producer whose clock is true, through both skewed nodes ...
    accepted = await schedule_spread(
        [node.url for node in skewed], 700, over_s=9, start_in_s=2, batch=100
    )
    # ... and relative delays, which the skewed nodes turn into a run_at themselves.
    stored_off: list[float] = []  # outside the request's own span: its span bounds the rest
    for node in skewed:
        for delay_ms in (2_000, 5_000, 8_000):
            stored, off = await submit_delayed(node, delay_ms, 50)
            accepted.update(stored)
            stored_off.extend(off)
    # A node with a true clock joins while the jobs fall due: ZooKeeper moves shards to it.
    await start_nodes(cluster, "true")
    ledger = await collector.reckon(accepted, deadline_s=60)
    clocks = {  # off the event loop: the collector reads on it
        node.name: (await asyncio.to_thread(readyz, node))[1]["clock"] for node in cluster.live()
    }
    late = [
        deliveries[0].received_at - accepted[job_id]
        for job_id, deliveries in collector.deliveries.items()
        if job_id in accepted
    ]
    print(
        f"\nnodes 20 s ahead and behind, a true one joining: {ledger}; relative delays stored "
        f"at most {max(stored_off) * 1000:.1f} ms off; lateness median "
        f"{statistics.median(late) * 1000:.1f} ms, max {max(late) * 1000:.1f} ms; clocks {clocks}"
    )
    assert ledger.lost == []
    assert ledger.early == []
    assert max(stored_off) <= STORED_WITHIN_S
    assert clocks["ahead"]["offset_s"] == pytest.approx(20.0, abs=0.1)
    assert clocks["behind"]["offset_s"] == pytest.approx(-20.0, abs=0.1)
    assert abs(clocks["true"]["offset_s"]) < 0.1
    assert all(clock["trusted"] for clock in clocks.values())


@pytest.fixture
def single(
    tmp_path: Path, database_url: str, amqp_url: str
) -> Iterator[tuple[DispatcherProcess, FakeClock]]:
    """A single node whose wall clock the test sets (true to begin with)."""
    clock = FakeClock(tmp_path, "+0s")
    node = DispatcherProcess(
        tmp_path,
        port=reserve_port(),
        env={
            "DISPATCHER_DATABASE_URL": database_url,
            "DISPATCHER_AMQP_URL": amqp_url,
            **FAST_LEASE,
            **clock.env,
        },
        name="faked",
    )
    yield node, clock
    print(node.logs())  # shown when the test fails
    node.stop()


async def test_a_node_whose_clock_is_past_the_limit_fires_nothing_and_says_why(
    single: tuple[DispatcherProcess, FakeClock], collector: Collector
) -> None:
    node, clock = single
    clock.set("+20s")
    await asyncio.to_thread(node.start, ready=False)
    status, answer = readyz(node)
    assert status == 503
    assert answer["checks"]["clock"] is False
    assert answer["clock"]["trusted"] is False
    assert answer["clock"]["offset_s"] == pytest.approx(20.0, abs=0.1)
    assert "ahead of PostgreSQL's" in answer["degraded"]["clock"]
    assert metric(node, "dispatcher_clock_offset_seconds") == pytest.approx(20.0, abs=0.1)

    accepted = await schedule_spread(node.url, 100, over_s=1, start_in_s=1)
    relative, off = await submit_delayed(node, 1_000, 20)
    accepted.update(relative)
    # Every job is due within 2 s; 3 s more and a node that fired would have fired them all.
    await asyncio.sleep(5)
    assert collector.deliveries == {}

    clock.set("+0s")  # NTP puts it right: the next measurement trusts it
    ledger = await collector.reckon(accepted, deadline_s=30)
    status, answer = readyz(node)
    print(f"\na node 20 s ahead, then put right: {ledger}; {answer['clock']}")
    assert ledger.lost == []
    assert ledger.early == []
    assert max(off) <= STORED_WITHIN_S
    assert status == 200
    assert answer["clock"]["trusted"] is True


STEPS = (("+1h", "ahead of"), ("+0s", None), ("-60s", "behind"), ("+0s", None))
STEP_EVERY_S = 2.5


async def test_the_hosts_clock_stepped_forwards_and_backwards_under_load_fires_nothing_early(
    single: tuple[DispatcherProcess, FakeClock], collector: Collector
) -> None:
    node, clock = single
    await asyncio.to_thread(node.start)
    accepted = await schedule_spread(node.url, 1500, over_s=12, start_in_s=1, batch=500)
    seen: list[str] = []
    for offset, reason in STEPS:
        await asyncio.sleep(STEP_EVERY_S)  # the jobs keep falling due meanwhile
        clock.set(offset)
        if reason is None:
            continue
        deadline = time.monotonic() + STEP_EVERY_S
        while time.monotonic() < deadline:
            status, answer = await asyncio.to_thread(readyz, node)
            if status == 503 and reason in str(answer.get("degraded", {}).get("clock")):
                seen.append(reason)
                break
            await asyncio.sleep(0.1)
    ledger = await collector.reckon(accepted, deadline_s=60)
    late = collector.lateness(accepted)
    print(
        f"\nthe host's clock stepped {' then '.join(o for o, _ in STEPS)} every "
        f"{STEP_EVERY_S} s under 125 jobs/s: {ledger}; said untrusted: {seen}; lateness "
        f"median {statistics.median(late) * 1000:.1f} ms, max {max(late):.2f} s"
    )
    assert ledger.lost == []
    assert ledger.early == []
    assert seen == ["ahead of", "behind"]
    assert readyz(node)[0] == 200
