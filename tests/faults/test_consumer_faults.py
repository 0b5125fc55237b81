"""Faults on the consuming side: an SDK consumer process killed with -9 mid-handling (its unacked
jobs are redelivered), and RabbitMQ restarted while jobs sit in the SDK's retry wait queues and in
its dead-letter queue (quorum queues, at-least-once dead-lettering: none lost)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from consumers_sdk import Consumer, topology
from devstack.collector import classify
from devstack.dispatcher_process import DispatcherProcess
from devstack.rabbitmq import RabbitServer
from devstack.spread import schedule_spread
from tests.support.consumers import fail_once_and_reject, running
from tests.support.process import spawn
from tests.support.queues import depth_reaches, drain_dead, wait_for_consumer
from tests.support.waiting import eventually

pytestmark = [pytest.mark.faults, pytest.mark.rabbitmq_version]
PREFETCH = 20


def events(results: Path) -> list[tuple[str, str, str]]:
    """(event, job id, extra) per line the recording consumers wrote, in order: ``start`` lines
    carry the redelivered flag, ``done`` lines the time the handler returned."""
    lines = [line.split() for line in results.read_text().splitlines() if line.strip()]
    return [(parts[0], parts[1], parts[2] if len(parts) > 2 else "") for parts in lines]


def most_in_flight(log: list[tuple[str, str, str]]) -> int:
    running_now: set[str] = set()
    most = 0
    for event, job_id, _ in log:
        if event == "start":
            running_now.add(job_id)
        else:
            running_now.discard(job_id)
        most = max(most, len(running_now))
    return most


def mid_handler(log: list[tuple[str, str, str]]) -> bool:
    done = {job_id for event, job_id, _ in log if event == "done"}
    return bool({job_id for event, job_id, _ in log if event == "start"} - done)


def handled_at(log: list[tuple[str, str, str]]) -> dict[str, list[float]]:
    done: dict[str, list[float]] = {}
    for event, job_id, at in log:
        if event == "done":
            done.setdefault(job_id, []).append(float(at))
    return done


async def test_a_consumer_killed_mid_handling_has_its_unacked_jobs_redelivered(
    tmp_path: Path, dispatcher: DispatcherProcess, amqp_url: str
) -> None:
    results = tmp_path / "handled.txt"
    results.touch()
    env = {"AMQP_URL": amqp_url, "RESULTS_FILE": str(results), "PREFETCH": str(PREFETCH)}
    args = ["-m", "consumers_sdk", "tests.support.recording_consumer:consumer"]
    first = spawn(args, env, tmp_path / "first.log")
    await wait_for_consumer(amqp_url, "crashy.crash.work")
    accepted = await schedule_spread(dispatcher.url, 1000, over_s=4, routing_key="crash.work")
    # Kill once 150 are done and some handler is mid-way: between two rounds of deliveries
    # every started job may be done for the few milliseconds the acks take.
    await eventually(
        lambda: (
            sum(e == "done" for e, _, _ in events(results)) >= 150 and mid_handler(events(results))
        ),
        30,
    )
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    before = events(results)
    done_before = {job_id for event, job_id, _ in before if event == "done"}
    cut_off = {job_id for event, job_id, _ in before if event == "start"} - done_before
    assert cut_off, "killed while handlers were running"
    assert most_in_flight(before) <= PREFETCH

    second = spawn(args, env, tmp_path / "second.log")
    try:
        await eventually(lambda: accepted.keys() <= handled_at(events(results)).keys(), 60)
    finally:
        second.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(second.wait, 30) == 0
    after = events(results)[len(before) :]
    redelivered = {job_id for event, job_id, again in after if event == "start" and again == "1"}
    ledger = classify(accepted, handled_at(events(results)))
    print(
        f"\nconsumer kill -9 with {len(cut_off)} jobs mid-handler after {len(done_before)} done, "
        f"{len(redelivered)} redelivered; handled {ledger}"
    )
    assert cut_off <= redelivered, "the jobs cut off were redelivered to the other consumer"
    assert most_in_flight(after) <= PREFETCH
    assert ledger.lost == []
    assert ledger.early == []


# Long enough that every retry still waits when the broker goes down, even when the 1 000 moves
# crawl on a loaded machine (the first copies must not expire before the last arrive).
RETRY_TIER_S = 30.0


async def test_a_broker_restart_loses_no_job_waiting_to_retry_or_dead(
    dispatcher: DispatcherProcess, amqp_url: str, rabbit_server: RabbitServer
) -> None:
    consumer = Consumer(amqp_url, group="faulty", prefetch=200, retry_tiers=(RETRY_TIER_S,))
    succeeded = fail_once_and_reject(
        consumer, retry_key="faults.retry", poison_key="faults.poison", tier_s=RETRY_TIER_S
    )

    retry_work = topology.work_queue("faulty", "faults.retry")
    dead = topology.dead_queue(topology.work_queue("faulty", "faults.poison"))
    async with running(consumer):
        retries = await schedule_spread(
            dispatcher.url, 1000, over_s=2, routing_key="faults.retry", batch=1000
        )
        poisoned = await schedule_spread(
            dispatcher.url, 500, over_s=2, routing_key="faults.poison", batch=500
        )
        waiting = topology.wait_queue(retry_work, RETRY_TIER_S)
        # At least: a job published twice (at-least-once) fails its first attempt twice.
        await depth_reaches(amqp_url, waiting, len(retries), 30, at_least=True)
        await depth_reaches(amqp_url, dead, len(poisoned), 30, at_least=True)
        await asyncio.to_thread(rabbit_server.restart)
        await eventually(lambda: retries.keys() <= succeeded.keys(), 90)
    retried = classify(retries, succeeded)
    parked = classify(poisoned, await drain_dead(amqp_url, dead))
    print(
        f"\nRabbitMQ restarted with {len(retries)} jobs in {waiting} and {len(poisoned)} in "
        f"{dead}: retried {retried}; dead-lettered {parked}"
    )
    for ledger in (retried, parked):
        assert ledger.lost == []
        assert ledger.early == []
