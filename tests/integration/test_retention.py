"""Retention: jobs finished longer ago than the retention are deleted in the background, and the
batches of events that name only deleted jobs, so the table stays bounded under a steady flow;
scheduled jobs are never touched, nor the events of a job still here."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg

from tests.support.nodes import client, running_node
from tests.support.stored_events import STORED_EVENTS, plant_events
from tests.support.waiting import eventually, until

RETENTION_S = 1.5
BATCHES = 20  # of 200 jobs, one every half second or so
# How long after its retention a finished job may still be here: its dispatch and mark, and the
# housekeeping round (every 0.3 s here) that deletes it, on a loaded machine.
SLACK_S = 3.0


async def test_finished_jobs_and_their_events_go_after_the_retention_and_the_table_stays_bounded(
    database_url: str, amqp_url: str
) -> None:
    counts: list[tuple[float, int]] = []  # (when, jobs in the table)
    answered: list[float] = []  # when each batch was answered
    db = await asyncpg.connect(database_url)
    try:
        async with (
            running_node(
                database_url=database_url,
                amqp_url=amqp_url,
                shard_count=8,
                retention_days=RETENTION_S / 86400,
                retention_batch=50,
                stats_interval_s=0.3,
            ) as node,
            client(node) as http,
        ):
            later = (
                await http.post(
                    "/v1/jobs", json={"routing_key": "a.b", "payload": 0, "delay_ms": 3_600_000}
                )
            ).json()["id"]
            first = None
            for _ in range(BATCHES):  # 4000 jobs over about 10 s, each dispatched at once
                jobs = [{"routing_key": "a.b", "payload": n} for n in range(200)]
                answer = (await http.post("/v1/jobs/batch", json={"jobs": jobs})).json()
                answered.append(time.monotonic())
                if first is None:
                    first = uuid.UUID(answer["jobs"][0]["id"])
                    for job in (first, uuid.UUID(later)):  # a batch each
                        await db.execute(
                            plant_events(
                                "SELECT $1::uuid AS job_id, 'succeeded' AS outcome, 1 AS attempt,"
                                " 'g' AS consumer_group, 'c' AS consumer, NULL AS error,"
                                " now() AS at"
                            ),
                            job,
                        )
                await asyncio.sleep(0.5)
                counts.append((time.monotonic(), await db.fetchval("SELECT count(*) FROM jobs")))
            deleted = node.core.metrics.registry.get_sample_value
            await eventually(
                lambda: (deleted("dispatcher_retention_deleted_total") or 0) >= BATCHES * 200, 20
            )
            assert (await http.get(f"/v1/jobs/{later}")).json()["state"] == "scheduled"
            # The first job's events went with it; the batch naming the job still here stays.
            planted = f"SELECT job_id FROM {STORED_EVENTS}"

            async def only_the_later_ones() -> bool:
                return [row["job_id"] for row in await db.fetch(planted)] == [uuid.UUID(later)]

            await until(only_the_later_ones, 20)
        assert await db.fetchval("SELECT count(*) FROM jobs") == 1
    finally:
        await db.close()
    # 4000 went in; each time the table was counted, only the batches answered within the
    # retention and the slack before were there, and the job due later: about 9 batches, never
    # the 20 a table that kept them would hold by the end.
    for at, count in counts:
        recent = sum(1 for then in answered if then > at - RETENTION_S - SLACK_S)
        assert count <= 1 + 200 * recent, (count, recent, counts, answered)
