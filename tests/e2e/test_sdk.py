"""The consumer SDK end to end: the examples against a dispatcher, a consumer process killed
with -9, and dead jobs brought back with `dispatcher dlq requeue`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from consumers_sdk import Consumer, Job
from tests.services.rabbitmq import RabbitServer
from tests.support.jobs_out import job, publish
from tests.support.process import DispatcherProcess
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]
PREFETCH = 5


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


def ledger(results: Path) -> list[tuple[str, str, bool]]:
    """(event, job id, redelivered) per line the recording consumers wrote, in order."""
    lines = [line.split() for line in results.read_text().splitlines() if line.strip()]
    return [(parts[0], parts[1], parts[2:] == ["1"]) for parts in lines]


def done_of(events: list[tuple[str, str, bool]]) -> set[str]:
    return {job_id for event, job_id, _ in events if event == "done"}


def running_in(results: Path) -> bool:
    events = ledger(results)
    return bool({job_id for event, job_id, _ in events if event == "start"} - done_of(events))


def most_in_flight(events: list[tuple[str, str, bool]]) -> int:
    running: set[str] = set()
    most = 0
    for event, job_id, _ in events:
        if event == "start":
            running.add(job_id)
        else:
            running.discard(job_id)
        most = max(most, len(running))
    return most


async def test_a_consumer_killed_mid_handling_loses_nothing(tmp_path: Path, amqp_url: str) -> None:
    results = tmp_path / "handled.txt"
    results.touch()
    env = {"AMQP_URL": amqp_url, "RESULTS_FILE": str(results), "PREFETCH": str(PREFETCH)}
    args = ["-m", "consumers_sdk", "tests.support.recording_consumer:consumer"]
    first = spawn(args, env, tmp_path / "first.log")
    await wait_for_queue(amqp_url, "crashy.crash.work")
    ids = await publish(amqp_url, [job("crash.work", i) for i in range(40)])
    # Kill once 8 are done and some handler is mid-way (they run in lockstep: between two rounds
    # every started job is done, for the few milliseconds the acks and the next deliveries take).
    await eventually(lambda: len(done_of(ledger(results))) >= 8 and running_in(results), 30)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    before = ledger(results)
    done_before = done_of(before)
    cut_off = {job_id for event, job_id, _ in before if event == "start"} - done_before
    assert cut_off, "killed while handlers were running"
    assert most_in_flight(before) <= PREFETCH

    second = spawn(args, env, tmp_path / "second.log")
    try:
        await eventually(lambda: set(ids) <= {j for e, j, _ in ledger(results) if e == "done"}, 60)
    finally:
        second.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(second.wait, 30) == 0
    after = ledger(results)[len(before) :]
    redelivered = {job_id for event, job_id, again in after if event == "start" and again}
    assert cut_off <= redelivered, "the jobs cut off were redelivered to the other consumer"
    assert most_in_flight(after) <= PREFETCH
    done = [job_id for event, job_id, _ in ledger(results) if event == "done"]
    print(
        f"\nconsumer kill -9 with {len(cut_off)} jobs mid-handler after {len(done_before)} done: "
        f"{len(set(done))} handled, {len(done) - len(set(done))} handled twice, "
        f"{len(set(ids) - set(done))} lost"
    )
    assert set(ids) <= set(done)


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
        assert "2/2" in some.stderr  # the progress bar
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
