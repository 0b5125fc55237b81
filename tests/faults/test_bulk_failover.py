"""kill -9 of the node working a bulk requeue, in a two-node cluster: the other node takes the
action over once its lease runs out and finishes it from the cursor; every matching job is
requeued exactly once (one history step naming the action) and delivered, the jobs the killed
node had put on its own shards too (their new owner's takeover walks them)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import httpx
import pytest

from devstack.collector import Collector
from devstack.node_cluster import Cluster, start_nodes
from tests.support.stored_events import STORED_EVENTS
from tests.support.waiting import until

pytestmark = pytest.mark.faults

JOBS = 600
SLOW = {
    "DISPATCHER_BULK_BATCH": "20",
    "DISPATCHER_BULK_DUTY": "0.05",  # a rest of a quarter lease after every batch
    "DISPATCHER_BULK_LEASE_S": "3",
    "DISPATCHER_BULK_POLL_S": "0.2",
}


async def test_a_bulk_requeue_whose_node_died_is_finished_by_another_once_per_job(
    cluster: Cluster, collector: Collector, database_url: str
) -> None:
    for name in ("n0", "n1"):
        await asyncio.to_thread(cluster.start, name, SLOW)
    await start_nodes(cluster)  # converged
    far = {"routing_key": "bulk.failover", "payload": 1, "delay_ms": 3_600_000}
    async with httpx.AsyncClient(base_url=cluster.nodes["n0"].url, timeout=30) as http:
        body = {"jobs": [far] * JOBS}
        ids = [job["id"] for job in (await http.post("/v1/jobs/batch", json=body)).json()["jobs"]]
        sql = await asyncpg.connect(database_url)
        try:
            await sql.execute(
                "UPDATE jobs SET state = 'dead', last_error = 'down', dispatched_at = now()"
                " WHERE id = ANY($1::uuid[])",
                ids,
            )
            answer = await http.post(
                "/v1/bulk-actions",
                json={"action": "requeue", "filter": {"routing_key": "bulk.failover"}},
            )
            assert answer.status_code == 202, answer.text
            action_id = uuid.UUID(answer.json()["id"])
            worker = ""

            async def worked_partly() -> bool:
                nonlocal worker
                row = await sql.fetchrow(
                    "SELECT worked_by, touched FROM bulk_actions WHERE id = $1", action_id
                )
                assert row is not None
                worker = row["worked_by"] or ""
                return bool(worker) and 0 < row["touched"] < JOBS // 2

            await until(worked_partly, 30)
            cluster.nodes[worker].kill()
            survivor = "n1" if worker == "n0" else "n0"

            async def done_by_the_survivor() -> bool:
                row = await sql.fetchrow(
                    "SELECT status, touched FROM bulk_actions WHERE id = $1", action_id
                )
                assert row is not None
                return (row["status"], row["touched"]) == ("done", JOBS)

            await until(done_by_the_survivor, 60)
            steps = await sql.fetch(
                f"SELECT job_id, count(*) AS n FROM {STORED_EVENTS}"
                " WHERE detail = $1 GROUP BY job_id",
                f"bulk action {action_id}: requeue",
            )
        finally:
            await sql.close()
    assert {str(row["job_id"]) for row in steps} == set(ids)
    assert {row["n"] for row in steps} == {1}
    assert await collector.wait_for(ids, 60) == set(), cluster.nodes[survivor].logs()
