"""Job dependencies end to end: a dispatcher process fires jobs, an SDK consumer handles them and
reports each outcome, and a job named in `after` releases (or cancels) the jobs waiting for it,
also across a dispatcher killed with -9."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from consumers_sdk import Consumer, Job, Reject
from devstack.dispatcher_process import FAST_LEASE, DispatcherProcess
from tests.support.consumers import running
from tests.support.nodes import WRITE
from tests.support.process import served
from tests.support.waiting import eventually, job_when

pytestmark = pytest.mark.e2e

# A released job keeps its run_at, usually already behind the loaded window: its due notice puts
# it into the heap. The safety sweep would find it too, but only after this grace, longer than
# the tests wait.
ENV = {**FAST_LEASE, "DISPATCHER_LEASE_S": "2", "DISPATCHER_SWEEP_GRACE_S": "120"}


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    yield from served(tmp_path, database_url, amqp_url, env=ENV)


class Steps:
    """What the handlers did, in order: ("start" | "end", job name)."""

    def __init__(self, consumer: Consumer) -> None:
        self.log: list[tuple[str, str]] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.failing: set[str] = set()

        @consumer.handler("flow.step")
        async def step(job: Job) -> None:
            name = job.payload["name"]
            self.log.append(("start", name))
            if name in self.gates:
                await self.gates[name].wait()
            else:
                await asyncio.sleep(0.2)  # long enough for a job released too early to start
            if name in self.failing:
                raise Reject(f"{name} cannot be done")
            self.log.append(("end", name))

    def at(self, event: str, name: str) -> int:
        return self.log.index((event, name))

    def count(self, event: str, name: str) -> int:
        return self.log.count((event, name))


async def submit(http: httpx.AsyncClient, name: str, *after: str, **fields: object) -> str:
    body = {"routing_key": "flow.step", "payload": {"name": name}, "after": list(after), **fields}
    response = await http.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id: str = response.json()["id"]
    return job_id


async def test_each_job_starts_only_after_its_prerequisites_succeeded(
    dispatcher: DispatcherProcess, amqp_url: str
) -> None:
    """A diamond: b and c after a, d after b and c; e after d (a chain through it)."""
    consumer = Consumer(amqp_url, group="flow", name="worker")
    steps = Steps(consumer)
    async with running(consumer), httpx.AsyncClient(base_url=dispatcher.url, headers=WRITE) as http:
        a = await submit(http, "a")
        b = await submit(http, "b", a)
        c = await submit(http, "c", a)
        d = await submit(http, "d", b, c)
        e = await submit(http, "e", d)
        await job_when(http, e, "succeeded")
        for earlier, later in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")]:
            assert steps.at("end", earlier) < steps.at("start", later), steps.log
        shown = (await http.get(f"/v1/jobs/{d}")).json()
        assert (shown["after"], shown["pending"]) == ([b, c], [])
    assert all(steps.count("start", name) == 1 for name in "abcde"), steps.log


async def test_a_dead_prerequisite_cancels_the_jobs_waiting_for_it_which_never_run(
    dispatcher: DispatcherProcess, amqp_url: str
) -> None:
    consumer = Consumer(amqp_url, group="flow", name="worker")
    steps = Steps(consumer)
    steps.failing.add("a")
    async with running(consumer), httpx.AsyncClient(base_url=dispatcher.url, headers=WRITE) as http:
        a = await submit(http, "a")
        b = await submit(http, "b", a)
        c = await submit(http, "c", b)
        dead = await job_when(http, a, "dead")
        assert dead["last_error"] == "Reject: a cannot be done"
        cancelled_b = await job_when(http, b, "cancelled")
        cancelled_c = await job_when(http, c, "cancelled")
    assert cancelled_b["last_error"] == f"prerequisite {a} dead"
    assert cancelled_c["last_error"] == f"prerequisite {b} cancelled"
    assert [name for _, name in steps.log] == ["a"]


async def test_a_dispatcher_killed_around_the_release_still_fires_the_dependent_once(
    dispatcher: DispatcherProcess, amqp_url: str
) -> None:
    """Killed (-9) while a is being handled, so its success is recorded only after a restart;
    then killed again once b is released but before b is due."""
    consumer = Consumer(amqp_url, group="flow", name="worker")
    steps = Steps(consumer)
    steps.gates["a"] = asyncio.Event()
    async with running(consumer), httpx.AsyncClient(base_url=dispatcher.url, headers=WRITE) as http:
        a = await submit(http, "a")
        b_due = time.time() + 10
        b = await submit(http, "b", a, delay_ms=10_000)
        await job_when(http, a, "dispatched")
        await eventually(lambda: steps.count("start", "a") == 1, 10)
        dispatcher.kill()
        steps.gates["a"].set()  # a succeeds while no dispatcher runs: its event waits in RabbitMQ

        await asyncio.to_thread(dispatcher.start)
        await job_when(http, b, "scheduled")  # released from the recorded success
        assert time.time() < b_due  # the restart was quick enough for this to test something
        assert steps.count("start", "b") == 0
        dispatcher.kill()

        await asyncio.to_thread(dispatcher.start)
        await job_when(http, b, "succeeded")
        await asyncio.sleep(1)  # room for a duplicate to show
    assert steps.count("start", "b") == 1, steps.log
    assert steps.at("end", "a") < steps.at("start", "b")
