"""The consumer SDK end to end: the examples against a dispatcher, and dead jobs brought back
with `dispatcher dlq requeue`. A consumer killed with -9 is in tests/faults."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from consumers_sdk import Consumer, DispatcherClient, Job
from devstack.dispatcher_process import DispatcherProcess
from devstack.jobs_out import job, publish
from devstack.rabbitmq import RabbitServer
from tests.support.consumers import running
from tests.support.process import spawn
from tests.support.queues import wait_for_consumer
from tests.support.waiting import eventually, until

pytestmark = [pytest.mark.e2e, pytest.mark.rabbitmq_version]
ROOT = Path(__file__).parents[2]


async def test_the_example_producer_and_consumer_work_against_a_dispatcher(
    tmp_path: Path, dispatcher: DispatcherProcess, amqp_url: str
) -> None:
    log = tmp_path / "consumer.log"
    consumer = spawn(
        ["-m", "consumers_sdk", "examples.consumer:consumer"],
        {"DISPATCHER_AMQP_URL": amqp_url},
        log,
    )
    try:
        await wait_for_consumer(amqp_url, "billing.orders.expire")
        producer = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "examples.producer", "4"],
            cwd=ROOT,
            env={**os.environ, "DISPATCHER_URL": dispatcher.url},
            capture_output=True,
            text=True,
            check=True,
        )
        assert producer.stdout.count(": created job ") == 4
        await eventually(lambda: log.read_text().count("expiring order") == 4, 30)
    finally:
        consumer.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(consumer.wait, 30) == 0
    orders = sorted(line.split()[2] for line in log.read_text().splitlines() if "expiring" in line)
    assert orders == ["0", "1", "2", "3"]


async def produced(url: str, count: int) -> list[tuple[str, str]]:
    """Runs the example producer: (outcome, job id) per order, from its lines."""
    run = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "examples.producer", str(count)],
        cwd=ROOT,
        env={**os.environ, "DISPATCHER_URL": url},
        capture_output=True,
        text=True,
        check=True,
    )
    # "order 0: created job <id>, due ..." or "order 0: kept job <id>, <state>: ..."
    return [(words[2], words[4].rstrip(",")) for words in map(str.split, run.stdout.splitlines())]


async def test_the_example_producer_schedules_again_once_its_jobs_finished(
    dispatcher: DispatcherProcess, amqp_url: str
) -> None:
    consumer = Consumer(amqp_url, group="example")
    gate = asyncio.Event()

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        await gate.wait()  # the jobs stay dispatched, unfinished, until the gate opens

    async with running(consumer), DispatcherClient(dispatcher.url) as client:
        first = await produced(dispatcher.url, 2)
        assert [outcome for outcome, _ in first] == ["created", "created"]
        pending = await produced(dispatcher.url, 2)  # scheduled or dispatched: not finished
        assert pending == [("kept", job_id) for _, job_id in first]

        async def finished() -> bool:
            states = {(await client.get(job_id)).state for _, job_id in first}
            return states == {"succeeded"}

        gate.set()
        await until(finished, 30)
        again = await produced(dispatcher.url, 2)
    assert [outcome for outcome, _ in again] == ["created", "created"]
    assert {job_id for _, job_id in again}.isdisjoint(job_id for _, job_id in first)


async def test_dlq_requeue_brings_dead_jobs_back_with_fresh_attempts(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    broken = True
    handled: list[tuple[str, int, str, object]] = []
    consumer = Consumer(amqp_url, group="billing", retry_tiers=(0.3,))

    @consumer.handler("orders.expire", max_attempts=2, backoff=lambda _: 0.3)
    async def expire(job: Job) -> None:
        if broken:
            raise RuntimeError("downstream is down")
        handled.append((job.id, job.attempt, job.routing_key, job.headers.get("tenant")))

    env = {
        **os.environ,
        "DISPATCHER_AMQP_URL": amqp_url,
        "DISPATCHER_AMQP_MANAGEMENT_URL": f"http://guest:guest@{rabbit_server.mgmt_url[7:]}",
    }

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "dispatcher", "dlq", *args],
            env=env,
            capture_output=True,
            text=True,
        )

    async def listed_dead() -> int:
        listing = json.loads((await cli("list", "--json")).stdout)
        return sum(q["messages"] for q in listing if q["name"] == "billing.orders.expire.dead")

    task = asyncio.create_task(consumer.run(handle_signals=False))
    await asyncio.wait_for(consumer.ready.wait(), 30)
    try:
        ids = await publish(amqp_url, [job("orders.expire", i) for i in range(5)])
        # The management API refreshes its counts every few seconds.
        async with asyncio.timeout(30):
            while await listed_dead() != 5:  # noqa: ASYNC110 - counted by another process
                await asyncio.sleep(0.5)
        table = (await cli("list")).stdout
        assert "billing.orders.expire.dead" in table
        assert "billing.orders.expire\n" in table  # its work queue
        broken = False
        some = await cli("requeue", "billing.orders.expire.dead", "--limit", "2")
        assert "requeued 2 jobs" in some.stdout
        assert "\r" not in some.stderr  # no progress bar off a terminal
        await eventually(lambda: len(handled) == 2, 20)
        rest = await cli("requeue", "billing.orders.expire.dead")
        assert "requeued 3 jobs" in rest.stdout
        await eventually(lambda: len(handled) == 5, 20)
        wrong = await cli("requeue", "billing.orders.expire")
        assert wrong.returncode == 1
        assert "not a dead-letter queue" in wrong.stderr
    finally:
        consumer.stop()
        await task
    assert sorted(job_id for job_id, *_ in handled) == sorted(ids)
    # Attempts start afresh; the job keeps its own routing key and its producer's headers.
    assert {(attempt, key, tenant) for _, attempt, key, tenant in handled} == {
        (1, "orders.expire", "t1")
    }
