"""Poison jobs mixed into ordinary batches, on an in-process node against real PostgreSQL and
RabbitMQ: the ordinary jobs arrive on time, each poison job ends dead with its reason (in the API,
its history and the metrics), and the node keeps firing."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import aio_pika
import asyncpg
import httpx
import pytest

from consumers_sdk import contract, ids
from devstack.collector import Collector
from tests.support.nodes import client, running_node

IDS = ids.JobIds()
SHARDS = 8


async def refusing_queue(amqp_url: str, routing_key: str) -> aio_pika.abc.AbstractConnection:
    """A queue that is always full and refuses what is published to it: RabbitMQ nacks every
    message routed there (a broker refusal aimed at those messages only). The jobs exchange
    must exist (the collector declares it)."""
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    exchange = await channel.get_exchange(contract.EXCHANGE)  # declared by the collector
    queue = await channel.declare_queue(
        f"full.{routing_key}",
        durable=True,
        arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
    )
    await queue.bind(exchange, routing_key)
    return connection


async def insert_raw(database_url: str, rows: list[tuple[str, str, float]]) -> list[str]:
    """Rows no API would accept (as an older version or a hand-written INSERT left them):
    (routing key, headers JSON, run_at seconds)."""
    connection = await asyncpg.connect(database_url)
    ids = []
    try:
        for number, (routing_key, headers, run_at_s) in enumerate(rows):
            job_id = IDS.next()
            await connection.execute(
                "INSERT INTO jobs (id, shard, routing_key, payload, headers, run_at)"
                " VALUES ($1, $2, $3, $4, $5::jsonb, $6)",
                job_id,
                number % SHARDS,
                routing_key,
                b"1",
                headers,
                datetime.fromtimestamp(run_at_s, UTC),
            )
            ids.append(str(job_id))
    finally:
        await connection.close()
    return ids


async def wait_dead(
    http: httpx.AsyncClient, ids: list[str], deadline_s: float
) -> dict[str, dict[str, object]]:
    jobs: dict[str, dict[str, object]] = {}
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        jobs = {job_id: (await http.get(f"/v1/jobs/{job_id}")).json() for job_id in ids}
        if all(job["state"] == "dead" for job in jobs.values()):
            break
        await asyncio.sleep(0.2)
    return jobs


@pytest.mark.parametrize("publish_path", ["framed", "per_message"])
async def test_poison_jobs_are_parked_with_their_reason_and_the_rest_fire_on_time(
    database_url: str, amqp_url: str, publish_path: str
) -> None:
    collector = Collector(amqp_url, binding="ordinary.#")
    await collector.start()
    refusing = await refusing_queue(amqp_url, "poison.full")
    try:
        async with running_node(
            database_url=database_url,
            amqp_url=amqp_url,
            shard_count=SHARDS,
            fire_batch=100,
            fire_workers=2,
            publish_path=publish_path,
        ) as node:
            assert node.messaging.publisher.path == publish_path
            due_s = time.time() + 2.0
            run_at = datetime.fromtimestamp(due_s, UTC).isoformat()
            jobs = [
                {"routing_key": "ordinary.work", "payload": n, "run_at": run_at} for n in range(300)
            ]
            for n in range(3):  # accepted by the API; RabbitMQ refuses them at firing time
                jobs.insert(n * 100, {"routing_key": "poison.full", "payload": n, "run_at": run_at})
            async with client(node) as http:
                answer = await http.post("/v1/jobs/batch", json={"jobs": jobs})
                assert answer.status_code == 201, answer.text
                stored = answer.json()["jobs"]
                ordinary = {j["id"]: due_s for j in stored if j["routing_key"] == "ordinary.work"}
                refused = [j["id"] for j in stored if j["routing_key"] == "poison.full"]
                unencodable = await insert_raw(
                    database_url,
                    [
                        ("x" * 300, "{}", due_s),  # a routing key AMQP cannot carry
                        ("ordinary.bad", "[1, 2]", due_s),  # headers that are not a table
                    ],
                )
                ledger = await collector.reckon(ordinary, deadline_s=30)
                parked = await wait_dead(http, [*refused, *unencodable], 30)
                history = (await http.get(f"/v1/jobs/{refused[0]}")).json()["history"]
                metrics = (await http.get("/metrics")).text
                assert (await http.get("/healthz")).status_code == 200
                after = await http.post(
                    "/v1/jobs", json={"routing_key": "ordinary.after", "payload": 1}
                )
                assert await collector.wait_for([after.json()["id"]], 10) == set()
    finally:
        await refusing.close()
        await collector.stop()
    assert ledger.once == len(ordinary), ledger
    assert ledger.lost == []
    assert ledger.early == []
    # Every ordinary job fired with its batch, not after the poison ones' retries (a refused job
    # is tried alone three times, a second and then two apart, before it is parked).
    last_ordinary = max(collector.deliveries[job_id][0].received_at for job_id in ordinary)
    first_parked = min(
        datetime.fromisoformat(str(parked[job_id]["updated_at"])).timestamp() for job_id in refused
    )
    assert last_ordinary < first_parked
    for job_id in refused:
        assert parked[job_id]["state"] == "dead", parked[job_id]
        assert "refused the message" in str(parked[job_id]["last_error"])
    for job_id in unencodable:
        assert parked[job_id]["state"] == "dead", parked[job_id]
        assert "cannot be encoded" in str(parked[job_id]["last_error"])
    dead = [step for step in history if step["event"] == "dead"]
    assert [step["group"] for step in dead] == ["dispatcher"]
    assert "refused" in dead[0]["error"]
    assert 'dispatcher_jobs_parked_total{routing_key="poison.full"} 3.0' in metrics
