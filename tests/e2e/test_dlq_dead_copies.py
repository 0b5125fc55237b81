"""One dead job, one dead copy: a dead job requeued through the API (one by one, or by a bulk
action) leaves its copy in .dead,
and ``dispatcher dlq requeue`` given the dispatcher's URL drops that copy (and says so) while it
moves back the copy of a job still dead."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from consumers_sdk import Consumer, Job, topology
from devstack.dispatcher_process import DispatcherProcess
from devstack.jobs_out import job, publish
from tests.support.consumers import running
from tests.support.process import served
from tests.support.queues import depth_reaches, queue_depth
from tests.support.waiting import eventually, job_when

pytestmark = pytest.mark.e2e
ADMIN = "admin-token-0123456789abcdef"
DEAD = topology.dead_queue("billing.orders.expire")


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    env = {"DISPATCHER_API_KEYS": f"{ADMIN}:admin"}
    yield from served(tmp_path, database_url, amqp_url, env=env, api_key=ADMIN)


async def dlq_requeue(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "dispatcher", "dlq", "requeue", DEAD],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("how", ["one by one", "bulk"])
async def test_dlq_requeue_drops_the_copy_of_a_job_requeued_through_the_api(
    dispatcher: DispatcherProcess, amqp_url: str, how: str
) -> None:
    broken = True
    handled: list[str] = []
    consumer = Consumer(amqp_url, group="billing", retry_tiers=(0.3,))

    @consumer.handler("orders.expire", max_attempts=1)
    async def expire(job: Job) -> None:
        if broken:
            raise RuntimeError(f"downstream is down for order {job.payload}")
        handled.append(job.id)

    async with (
        running(consumer),
        httpx.AsyncClient(base_url=dispatcher.url, headers=dispatcher.auth, timeout=10) as http,
    ):
        created = [
            (await http.post("/v1/jobs", json={"routing_key": "orders.expire", "payload": n}))
            for n in (1, 2)
        ]
        requeued, still_dead = (response.json()["id"] for response in created)
        for job_id in (requeued, still_dead):
            await job_when(http, job_id, "dead")
        await depth_reaches(amqp_url, DEAD, 2, 30)

        broken = False
        if how == "bulk":  # the first job only, found by its error
            only = {"state": "dead", "routing_key": "orders.expire", "error_contains": "order 1"}
            action = {"action": "requeue", "filter": only}
            (await http.post("/v1/bulk-actions", json=action)).raise_for_status()
        else:
            (await http.post(f"/v1/jobs/{requeued}/requeue")).raise_for_status()
        await job_when(http, requeued, "succeeded")
        assert handled == [requeued]
        assert await queue_depth(amqp_url, DEAD) == 2  # the API left its copy in .dead

        env = {
            "DISPATCHER_AMQP_URL": amqp_url,
            "DISPATCHER_URL": dispatcher.url,
            "DISPATCHER_API_KEY": ADMIN,
        }
        done = await dlq_requeue(env)
        assert done.returncode == 0, done.stderr
        assert f"requeued 1 jobs from {DEAD}" in done.stdout
        assert "dropped 1 dead copies of jobs requeued or finished since (requeued 1)" in (
            done.stdout
        )
        await eventually(lambda: len(handled) == 2, 30)
    assert handled == [requeued, still_dead]  # the requeued job ran once, the dead one again
    assert await queue_depth(amqp_url, DEAD) == 0


async def test_without_the_dispatchers_url_every_copy_moves_and_the_check_is_said_skipped(
    amqp_url: str,
) -> None:
    consumer = Consumer(amqp_url, group="billing", report_events=False)
    handled: list[str] = []
    broken = True

    @consumer.handler("orders.expire", max_attempts=1)
    async def expire(job: Job) -> None:
        if broken:
            raise RuntimeError("downstream is down")
        handled.append(job.id)

    async with running(consumer):
        ids = await publish(amqp_url, [job("orders.expire", 1)])
        await depth_reaches(amqp_url, DEAD, 1, 30)
        broken = False
        done = await dlq_requeue({"DISPATCHER_AMQP_URL": amqp_url, "DISPATCHER_URL": ""})
        assert done.returncode == 0, done.stderr
        assert "requeued 1 jobs" in done.stdout
        assert "not checked against the dispatcher" in done.stdout
        await eventually(lambda: handled == ids, 30)
