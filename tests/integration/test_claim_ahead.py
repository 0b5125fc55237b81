"""Firing claims ahead: the jobs falling due within the next 50 ms are claimed in one fenced
statement, and each is published at its own due time, never before (a real node, PostgreSQL and
RabbitMQ)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from devstack.collector import Collector
from dispatcher.node import Node
from tests.support.nodes import client, running_node

SPREAD = 40  # jobs, one a millisecond: all within one claim's reach


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, node_id="ahead-test", shard_count=16
    ) as running:
        yield running


def claims(node: Node) -> float:
    return node.core.metrics.registry.get_sample_value("dispatcher_claims_total") or 0.0


async def test_jobs_due_a_millisecond_apart_are_claimed_together_and_none_is_published_early(
    node: Node, collector: Collector
) -> None:
    first = datetime.now(UTC) + timedelta(seconds=3)
    run_ats = [first + timedelta(milliseconds=number) for number in range(SPREAD)]
    jobs = [
        {"routing_key": "ahead.spread", "payload": number, "run_at": run_at.isoformat()}
        for number, run_at in enumerate(run_ats)
    ]
    async with client(node) as http:
        response = await http.post("/v1/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201
    before = claims(node)
    assert datetime.now(UTC) < first - timedelta(seconds=1), "stored too late to tell"
    accepted = {
        job["id"]: run_at.timestamp()
        for job, run_at in zip(response.json()["jobs"], run_ats, strict=True)
    }

    ledger = await collector.reckon(accepted, deadline_s=30, quiet_s=0.5)

    assert (ledger.once, ledger.early, ledger.lost, ledger.duplicated) == (SPREAD, [], [], {})
    # One statement claims the 40 jobs (a second one at most, if a worker woke between two of
    # them); claiming only what is due at each turn took one a publish round, ten here.
    assert claims(node) - before <= 2
