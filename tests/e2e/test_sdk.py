"""The consumer SDK end to end: the examples against a dispatcher, a consumer process killed
with -9, and dead jobs brought back with `dispatcher dlq requeue`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from consumers_sdk import Consumer, Job
from tests.services.ports import free_port
from tests.services.rabbitmq import RabbitServer
from tests.support.jobs_out import job, publish
from tests.support.process import DispatcherProcess
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def queue_exists(amqp_url: str, name: str) -> bool:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(name, passive=True)
        return True
    except aio_pika.exceptions.ChannelClosed:
        return False
    finally:
        await connection.close()


async def wait_for_queue(amqp_url: str, name: str) -> None:
    async with asyncio.timeout(30):
        while not await queue_exists(amqp_url, name):  # noqa: ASYNC110 - another process declares it
            await asyncio.sleep(0.2)


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    process = DispatcherProcess(
        tmp_path,
        port=free_port(),
        env={"DISPATCHER_DATABASE_URL": database_url, "DISPATCHER_AMQP_URL": amqp_url},
    )
    process.start()
    yield process
    process.stop()


async def test_the_example_producer_and_consumer_work_against_a_dispatcher(
    tmp_path: Path, dispatcher: DispatcherProcess, amqp_url: str
) -> None:
    log = tmp_path / "consumer.log"
    consumer = spawn(
        ["-m", "consumers_sdk", "examples.consumer:consumer"], {"AMQP_URL": amqp_url}, log
    )
    try:
        await wait_for_queue(amqp_url, "billing.orders.expire")
        producer = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "examples.producer", "4"],
            cwd=ROOT,
            env={**os.environ, "DISPATCHER_URL": dispatcher.url},
            capture_output=True,
            text=True,
            check=True,
        )
        assert producer.stdout.count("scheduled ") == 4
        await eventually(lambda: log.read_text().count("expiring order") == 4, 30)
    finally:
        consumer.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(consumer.wait, 30) == 0
    orders = sorted(line.split()[2] for line in log.read_text().splitlines() if "expiring" in line)
    assert orders == ["0", "1", "2", "3"]


async def test_a_consumer_killed_mid_handling_loses_nothing(tmp_path: Path, amqp_url: str) -> None:
    results = tmp_path / "handled.txt"
    results.touch()
    env = {"AMQP_URL": amqp_url, "RESULTS_FILE": str(results)}
    args = ["-m", "consumers_sdk", "tests.support.slow_consumer:consumer"]
    first = spawn(args, env, tmp_path / "first.log")
    await wait_for_queue(amqp_url, "crashy.crash.work")
    ids = await publish(amqp_url, [job("crash.work", i) for i in range(40)])
    await eventually(lambda: len(results.read_text().split()) >= 8, 30)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    handled_before = len(results.read_text().split())
    second = spawn(args, env, tmp_path / "second.log")
    try:
        await eventually(lambda: set(ids) <= set(results.read_text().split()), 60)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    handled = results.read_text().split()
    print(
        f"\nconsumer kill -9 after {handled_before} jobs: {len(set(handled))} handled, "
        f"{len(handled) - len(set(handled))} handled twice, 0 lost"
    )
    assert set(ids) <= set(handled)


async def test_dlq_requeue_brings_dead_jobs_back_with_fresh_attempts(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    broken = True
    handled: list[tuple[str, int]] = []
    consumer = Consumer(amqp_url, group="billing", retry_tiers=(0.3,))

    @consumer.handler("orders.expire", max_attempts=2, backoff=lambda _: 0.3)
    async def expire(job: Job) -> None:
        if broken:
            raise RuntimeError("downstream is down")
        handled.append((job.id, job.attempt))

    env = {
        **os.environ,
        "DISPATCHER_AMQP_URL": amqp_url,
        "DISPATCHER_AMQP_MANAGEMENT_URL": f"http://guest:guest@{rabbit_server.mgmt_url[7:]}",
    }

    def cli(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "dispatcher", "dlq", *args],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    def dead_count() -> int:
        listing = json.loads(cli("list", "--json"))
        return sum(q["messages"] for q in listing if q["name"] == "billing.orders.expire.dead")

    task = asyncio.create_task(consumer.run(handle_signals=False))
    await asyncio.wait_for(consumer.ready.wait(), 30)
    try:
        ids = await publish(amqp_url, [job("orders.expire", i) for i in range(5)])
        # The management API refreshes its counts every few seconds.
        await eventually(lambda: dead_count() == 5, 30, poll_s=0.5)
        broken = False
        output = await asyncio.to_thread(cli, "requeue", "billing.orders.expire.dead")
        assert "requeued 5 jobs" in output
        await eventually(lambda: len(handled) == 5, 20)
    finally:
        consumer.stop()
        await task
    assert sorted(job_id for job_id, _ in handled) == sorted(ids)
    assert {attempt for _, attempt in handled} == {1}
