"""The operator's CLI against a real dispatcher process with API keys: jobs, cluster status,
stats; and one dead job sent back to its routing key with its history in its headers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from consumers_sdk import Consumer, Job, topology
from devstack.rabbitmq import RabbitServer
from tests.integration.test_consumer import depth_reaches, queue_depth
from tests.support.jobs_out import job, publish
from tests.support.process import DispatcherProcess, served
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e
ADMIN = "admin-token-0123456789abcdef"


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    yield from served(
        tmp_path,
        database_url,
        amqp_url,
        env={"DISPATCHER_API_KEYS": f"{ADMIN}:admin", "DISPATCHER_STATS_INTERVAL_S": "0.2"},
        api_key=ADMIN,
    )


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "dispatcher", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )


async def test_jobs_cluster_and_stats_commands_with_an_api_key(
    dispatcher: DispatcherProcess,
) -> None:
    env = {"DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ADMIN}
    later = {"routing_key": "orders.expire", "payload": 1, "delay_ms": 3_600_000}
    async with httpx.AsyncClient(
        base_url=dispatcher.url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        ids = [(await http.post("/v1/jobs", json=later)).json()["id"] for _ in range(3)]

    listed = await cli(env, "jobs", "list", "--json")
    assert [j["id"] for j in json.loads(listed.stdout)] == ids
    table = (await cli(env, "jobs", "list", "--routing-key", "orders.expire")).stdout
    assert table.splitlines()[0].split() == ["id", "state", "routing", "key", "run", "at", "error"]
    assert len(table.splitlines()) == 4
    shown = (await cli(env, "jobs", "show", ids[0])).stdout
    assert "scheduled" in shown
    assert ids[0] in shown
    cancelled = await cli(env, "jobs", "cancel", ids[0], ids[1])
    assert cancelled.returncode == 0, cancelled.stderr
    assert "2/2" in cancelled.stderr  # the progress bar
    status = (await cli(env, "cluster", "status")).stdout
    assert "node  leader  256     0-255" in status
    await asyncio.sleep(0.5)  # a stats round
    stats = json.loads((await cli(env, "stats", "--json")).stdout)
    assert (stats["by_state"]["cancelled"], stats["by_state"]["scheduled"]) == (2, 1)
    assert "orders.expire" in (await cli(env, "stats")).stdout
    refused = await cli({"DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ""}, "stats")
    assert refused.returncode == 1
    assert "401" in refused.stderr


async def test_dlq_requeue_of_one_job_sends_it_to_its_routing_key_with_its_history(
    amqp_url: str,
) -> None:
    broken = True
    handled: list[tuple[str, int, object]] = []
    consumer = Consumer(amqp_url, group="billing", retry_tiers=(0.3,), report_events=False)

    @consumer.handler("orders.expire", max_attempts=2, backoff=lambda _: 0.3)
    async def expire(job: Job) -> None:
        if broken:
            raise RuntimeError("downstream is down")
        handled.append((job.id, job.attempt, (job.message.headers or {}).get("x-dead-attempts")))

    dead = topology.dead_queue("billing.orders.expire")
    task = asyncio.create_task(consumer.run(handle_signals=False))
    await asyncio.wait_for(consumer.ready.wait(), 30)
    try:
        ids = await publish(amqp_url, [job("orders.expire", i) for i in range(3)])
        await depth_reaches(amqp_url, dead, 3, 20)
        broken = False
        moved = await cli(
            {"DISPATCHER_AMQP_URL": amqp_url}, "dlq", "requeue", dead, "--job", ids[1]
        )
        assert moved.returncode == 0, moved.stderr
        assert f"requeued job {ids[1]}" in moved.stdout
        assert "routing key orders.expire" in moved.stdout
        await eventually(lambda: len(handled) == 1, 20)
        missing = await cli({"DISPATCHER_AMQP_URL": amqp_url}, "dlq", "requeue", dead, "--job", "x")
        assert missing.returncode == 1
        assert "no job x" in missing.stderr
    finally:
        consumer.stop()
        await task
    assert handled == [(ids[1], 1, 2)]  # a fresh attempt; its history rode along
    assert await queue_depth(amqp_url, dead) == 2  # the others stayed, each looked at once


async def test_broker_apply_policies_and_dlq_list_as_a_user_runs_them(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    env = {
        "DISPATCHER_AMQP_URL": amqp_url,
        "DISPATCHER_AMQP_MANAGEMENT_URL": rabbit_server.mgmt_url.replace(
            "http://", "http://guest:guest@"
        ),
    }
    dry = await cli(env, "broker", "apply-policies", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would apply policy dispatcher-events" in dry.stdout
    applied = await cli(env, "broker", "apply-policies", "--priority", "5")
    assert applied.returncode == 0, applied.stderr
    assert "applied policy dispatcher-events" in applied.stdout
    assert ("dispatcher-dead-letter-queues" in applied.stdout) == (rabbit_server.major >= 4)
    listed = await cli(env, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    # apply-policies declared the events' dead-letter queue; it is listed, empty and counted.
    assert {
        "name": topology.EVENTS_DEAD_QUEUE,
        "messages": 0,
        "work_queue": "dispatcher.events",
    } in (json.loads(listed.stdout))
    unreachable = await cli(
        {**env, "DISPATCHER_AMQP_MANAGEMENT_URL": "http://127.0.0.1:9/"}, "broker", "apply-policies"
    )
    assert unreachable.returncode == 1
    assert "management API" in unreachable.stderr
