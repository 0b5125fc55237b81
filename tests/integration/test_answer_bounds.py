"""What one request may make a node build: a page of jobs or schedules ends once its payloads
pass ``DISPATCHER_MAX_PAGE_BYTES`` (one item at least), and ``next_after`` leads on to the rest,
so a page of large payloads is never a thousand of them; a job's history shows its newest
``DISPATCHER_MAX_HISTORY_EVENTS`` reported events and counts the others."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dispatcher.node import Node
from tests.support.nodes import WRITE, client, running_node
from tests.support.stored_events import plant_events

PAGE_BYTES = 25_000
PAYLOAD = {"blob": "x" * 10_000}  # about 10 KB a job: three start under the bound
HISTORY_EVENTS = 5


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="bounds",
        shard_count=4,
        max_page_bytes=PAGE_BYTES,
        max_history_events=HISTORY_EVENTS,
    ) as running:
        yield running


async def test_a_page_of_jobs_ends_past_its_bytes_and_next_after_leads_to_the_rest(
    node: Node,
) -> None:
    later = {"routing_key": "orders.remind", "payload": PAYLOAD, "delay_ms": 600_000}
    async with client(node) as http:
        made = await http.post("/v1/jobs/batch", json={"jobs": [later] * 7}, headers=WRITE)
        assert made.status_code == 201, made.text
        pages: list[list[str]] = []
        after = ""
        while True:
            page = (await http.get(f"/v1/jobs?limit=1000{after}")).json()
            pages.append([job["id"] for job in page["jobs"]])
            if page["next_after"] is None:
                break
            after = f"&after={page['next_after']}"
    assert [len(page) for page in pages] == [3, 3, 1]
    assert [i for page in pages for i in page] == [job["id"] for job in made.json()["jobs"]]


async def test_a_page_of_schedules_ends_past_its_bytes_too(node: Node) -> None:
    async with client(node) as http:
        for index in range(4):
            body = {
                "name": f"s{index}",
                "cron": "0 3 * * *",
                "job": {"routing_key": "reports.nightly", "payload": PAYLOAD},
            }
            assert (await http.post("/v1/schedules", json=body)).status_code == 201
        first = (await http.get("/v1/schedules?limit=1000")).json()
        rest = (await http.get(f"/v1/schedules?after={first['next_after']}")).json()
    assert [s["name"] for s in first["schedules"]] == ["s0", "s1", "s2"]
    assert ([s["name"] for s in rest["schedules"]], rest["next_after"]) == (["s3"], None)


async def test_a_jobs_history_shows_its_newest_events_and_counts_the_older_ones(
    node: Node, database_url: str
) -> None:
    later = {"routing_key": "orders.remind", "payload": 1, "delay_ms": 600_000}
    async with client(node) as http:
        job_id = (await http.post("/v1/jobs", json=later, headers=WRITE)).json()["id"]
        await report_attempts(database_url, job_id, attempts=HISTORY_EVENTS + 7)
        got = (await http.get(f"/v1/jobs/{job_id}")).json()
    attempts = [step["attempt"] for step in got["history"] if step["event"] == "failed"]
    assert attempts == list(range(8, HISTORY_EVENTS + 8))  # the newest, oldest first
    assert got["events_omitted"] == 7
    assert got["history"][0]["event"] == "scheduled"


async def report_attempts(database_url: str, job_id: str, *, attempts: int) -> None:
    """As many failed attempts as a consumer could report, a second apart."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            plant_events(
                "SELECT $1::uuid AS job_id, 'failed' AS outcome, n AS attempt,"
                " 'billing' AS consumer_group, 'w1' AS consumer, 'boom' AS error,"
                " now() + make_interval(secs => n) AS at FROM generate_series(1, $2) AS n"
            ),
            uuid.UUID(job_id),
            attempts,
        )
    finally:
        await connection.close()
