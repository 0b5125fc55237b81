"""A job's priority orders firing on a real node: a catch-up (here, a paused key let go) drains the
highest priority first, and of jobs due at the same instant the higher priority goes first. One
firing worker, so that the order published is the order fired."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from devstack.collector import Collector
from dispatcher.node import Node
from tests.support.nodes import client, running_node

KEY = "reports.build"
BATCH = 25


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="priorities",
        shard_count=8,
        fire_batch=BATCH,
        fire_workers=1,
    ) as running:
        yield running


async def submit(http: httpx.AsyncClient, run_ats: list[datetime]) -> dict[str, int]:
    """A job at each time, of a random priority (0-9, or none); id -> priority (none: 0)."""
    rng = random.Random(7)
    priorities = [rng.choice([None, *range(10)]) for _ in run_ats]
    jobs = [
        {"routing_key": KEY, "payload": n, "run_at": at.isoformat(), "priority": priority}
        for n, (at, priority) in enumerate(zip(run_ats, priorities, strict=True))
    ]
    answer = await http.post("/v1/jobs/batch", json={"jobs": jobs})
    assert answer.status_code == 201, answer.text
    return {
        job["id"]: priority or 0
        for job, priority in zip(answer.json()["jobs"], priorities, strict=True)
    }


def arrival_priorities(collector: Collector, jobs: dict[str, int]) -> list[int]:
    arrived = sorted(jobs, key=lambda job: collector.deliveries[job][0].received_at)
    return [jobs[job] for job in arrived]


async def test_a_backlog_of_mixed_priorities_drains_highest_first(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        await http.post(f"/v1/limits/{KEY}/pause", json={})
        now = datetime.now(UTC)
        jobs = await submit(http, [now + timedelta(milliseconds=n) for n in range(400)])
        await collector.settle(1.5)  # every one due, and held
        assert not collector.deliveries
        await http.post(f"/v1/limits/{KEY}/resume")
        ledger = await collector.reckon(dict.fromkeys(jobs, 0.0), deadline_s=30)
    assert ledger.lost == []
    order = arrival_priorities(collector, jobs)
    assert order == sorted(order, reverse=True), order


async def test_of_jobs_due_at_the_same_instant_the_higher_priority_goes_first(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        at = datetime.now(UTC) + timedelta(seconds=2)
        jobs = await submit(http, [at] * 200)
        ledger = await collector.reckon(dict.fromkeys(jobs, at.timestamp()), deadline_s=30)
    assert ledger.lost == []
    assert ledger.early == []
    order = arrival_priorities(collector, jobs)
    assert order == sorted(order, reverse=True), order
