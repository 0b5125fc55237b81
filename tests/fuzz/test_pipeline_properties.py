"""Past the 2xx: property tests (hypothesis) that submit what the API and ``enqueue`` accept, over
each field's whole accepted range with the extremes first, to an in-process node against real
PostgreSQL and RabbitMQ, and follow every job to its end: delivered with the documented message
properties, or expired. A job due far ahead is checked stored, then moved to now and followed.
After every example the node is still running, no loop is failing, and no job is left
``scheduled`` or ``dispatching`` past its lease."""

from __future__ import annotations

import asyncio
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers_sdk import contract, validation
from consumers_sdk.enqueue import enqueue
from consumers_sdk.reporter import EventReporter
from devstack.collector import Collector, Delivery
from dispatcher.node import Node
from tests.support.nodes import running_node
from tests.support.probe import Probe

LEASE_S = 3.0
LIMITS = validation.DEFAULT_LIMITS
FAR_S = LIMITS.max_delay_days * 86_400 - 3_600  # an hour inside the bound
ENDED = {"dispatched", "expired"}
INT64 = 2**63 - 1
FLOAT32 = struct.Struct(">f")

# Field values, extremes first (hypothesis tries the first branch of one_of most readily).
words = st.from_regex(r"\A[A-Za-z0-9_:-]{1,12}\Z")
routing_keys = st.one_of(
    st.sampled_from(["p", "p." + "k" * 253, ":-_.x"]),  # one letter, 255 bytes, odd characters
    st.lists(words, min_size=1, max_size=5).map(lambda parts: "p." + ".".join(parts)),
)
texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
header_values = st.one_of(
    st.sampled_from(
        [-INT64 - 1, INT64, 0, validation.FLOAT32_MAX, -5e-324, 0.1, True, False, "", "é" * 300]
    ),
    texts.filter(lambda text: len(text.encode()) < 700),
    st.integers(-INT64 - 1, INT64),
    st.floats(-validation.FLOAT32_MAX, validation.FLOAT32_MAX),
)
header_names = st.one_of(
    st.sampled_from(["h" * 128, "é" * 64, "a", "X-Custom", "x-deadline", "x-deliveryman"]),
    st.from_regex(r"\A[a-z][a-z0-9-]{0,30}\Z"),
).filter(lambda name: validation.header_name_problem(name) is None)
headers = st.one_of(
    st.just({}),
    st.dictionaries(header_names, header_values, max_size=LIMITS.max_headers),
).filter(lambda found: validation.headers_problem(found, LIMITS) is None)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-INT64 - 1, INT64),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
payloads = st.one_of(
    st.sampled_from([None, 0, "", [], {}]),
    st.just(None).map(lambda _: "x" * (LIMITS.max_payload_bytes - 2)),  # 256 KiB encoded
    st.recursive(
        json_leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
        max_leaves=10,
    ),
).filter(lambda value: len(json.dumps(value, allow_nan=False)) <= LIMITS.max_payload_bytes)
ttls = st.one_of(
    st.none(), st.sampled_from([1, validation.MAX_TTL_MS]), st.integers(1, validation.MAX_TTL_MS)
)


@dataclass(frozen=True)
class Timing:
    kind: str  # "past", "soon" or "far"
    value: float  # past: seconds since the epoch; soon: delay in ms; far: seconds ahead


timings = st.one_of(
    st.builds(Timing, st.just("past"), st.sampled_from([0.0, 0.001])),  # the epoch itself
    st.builds(Timing, st.just("soon"), st.integers(0, 1500).map(float)),
    st.builds(Timing, st.just("far"), st.just(float(FAR_S))),
    st.builds(Timing, st.just("past"), st.floats(0, time.time() - 60)),
)
jobs = st.fixed_dictionaries(
    {"routing_key": routing_keys, "payload": payloads, "timing": timings},
    optional={
        "headers": headers,
        "priority": st.integers(0, 9),
        "ttl_ms": ttls,
        "idempotency_key": texts.filter(lambda key: 0 < len(key) <= 255),
        "max_attempts": st.integers(1, contract.MAX_ATTEMPTS_LIMIT),
        "retry_backoff_s": st.lists(
            st.floats(0, contract.RETRY_BACKOFF_MAX_S),
            min_size=1,
            max_size=contract.RETRY_BACKOFF_MAX_STEPS,
        ),
    },
)
PIPELINE = settings(
    max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def api_body(job: dict[str, Any]) -> dict[str, Any]:
    body = {key: value for key, value in job.items() if key != "timing"}
    timing: Timing = job["timing"]
    if timing.kind == "soon":
        body["delay_ms"] = int(timing.value)
    elif timing.kind == "past":
        body["run_at"] = datetime.fromtimestamp(timing.value, UTC).isoformat()
    else:
        body["run_at"] = (datetime.now(UTC) + timedelta(seconds=timing.value)).isoformat()
    return body


async def enqueued(database_url: str, job: dict[str, Any]) -> str:
    """The same job through ``enqueue`` on a connection of the producer's own."""
    body = api_body(job)
    connection = await asyncpg.connect(database_url)
    try:
        placed = await enqueue(
            connection,
            body["routing_key"],
            body["payload"],
            delay=body["delay_ms"] / 1000 if "delay_ms" in body else None,
            run_at=datetime.fromisoformat(body["run_at"]) if "run_at" in body else None,
            headers=body.get("headers"),
            priority=body.get("priority"),
            ttl=body["ttl_ms"] / 1000 if body.get("ttl_ms") is not None else None,
            idempotency_key=body.get("idempotency_key"),
            max_attempts=body.get("max_attempts"),
            retry_backoff=body.get("retry_backoff_s"),
        )
    finally:
        await connection.close()
    return placed.id


class Pipeline(Probe):
    """Submits on the test's loop while hypothesis drives from a worker thread, and follows each
    job to its end."""

    timeout_s = 120.0  # an example follows several jobs to their end

    def __init__(
        self, node: Node, task: asyncio.Task[None], collector: Collector, dsn: str
    ) -> None:
        super().__init__(node, dsn)
        self._node = node
        self._task = task
        self.collector = collector
        self._dsn = dsn
        self.ends: dict[str, int] = {}

    async def submit(self, path: str, batch: list[dict[str, Any]]) -> list[str]:
        for job in batch:  # unique per example, so each submission creates its job
            if "idempotency_key" in job:
                job["idempotency_key"] = f"{uuid.uuid4().hex}{job['idempotency_key']}"[:255]
        if path == "enqueue":
            return [await enqueued(self._dsn, job) for job in batch]
        bodies = [api_body(job) for job in batch]
        if path == "batch":
            answer = await self.http.post("/v1/jobs/batch", json={"jobs": bodies})
            assert answer.status_code in (200, 201), answer.text
            return [job["id"] for job in answer.json()["jobs"]]
        ids = []
        for body in bodies:
            answer = await self.http.post("/v1/jobs", json=body)
            assert answer.status_code in (200, 201), answer.text
            ids.append(answer.json()["id"])
        return ids

    async def follow(self, job_id: str, job: dict[str, Any]) -> None:
        if job["timing"].kind == "far":
            stored = (await self.http.get(f"/v1/jobs/{job_id}")).json()
            assert stored["state"] == "scheduled", stored
            moved = await self.http.patch(f"/v1/jobs/{job_id}", json={"delay_ms": 0})
            assert moved.status_code == 200, moved.text
        deadline = time.monotonic() + LEASE_S + 15
        while True:
            state = (await self.http.get(f"/v1/jobs/{job_id}")).json()
            if state["state"] in ENDED:
                break
            assert time.monotonic() < deadline, f"stuck: {state}"
            await asyncio.sleep(0.05)
        self.ends[state["state"]] = self.ends.get(state["state"], 0) + 1
        if state["state"] == "dispatched":
            assert await self.collector.wait_for([job_id], 10) == set(), state
            check_message(self.collector.deliveries[job_id][0], job_id, state)
        else:
            assert job.get("ttl_ms") is not None, state  # only a ttl ends a job unpublished

    async def check_alive(self) -> None:
        assert not self._task.done(), "the node stopped"
        degraded = self._node.core.supervisor.degraded()
        assert degraded == {}, degraded

    def example(self, path: str, batch: list[dict[str, Any]]) -> None:
        async def go() -> None:
            ids = await self.submit(path, batch)
            await asyncio.gather(*(self.follow(*pair) for pair in zip(ids, batch, strict=True)))
            await self.check_alive()

        self.run(go)


def check_message(delivery: Delivery, job_id: str, stored: dict[str, Any]) -> None:
    """The message contract: id, routing key, body, headers, priority, expiration."""
    assert delivery.message_id == job_id
    assert delivery.routing_key == stored["routing_key"]
    assert json.loads(delivery.body) == stored["payload"]
    assert delivery.headers[contract.HEADER_JOB_ID] == job_id
    for name, value in stored["headers"].items():
        if isinstance(value, float):  # AMQP's 32-bit float, as documented
            value = FLOAT32.unpack(FLOAT32.pack(value))[0]
        assert delivery.headers[name] == value, (name, delivery.headers[name], value)
    assert (delivery.properties["priority"] or 0) == (stored["priority"] or 0)
    expiration = delivery.properties["expiration"]  # seconds, as aio-pika decodes it
    if stored["ttl_ms"] is None:
        assert expiration is None
    else:
        assert 1 <= round(float(expiration) * 1000) <= validation.MAX_TTL_MS


@pytest.fixture
async def pipeline(
    database_url: str, amqp_url: str, collector: Collector
) -> AsyncIterator[Pipeline]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="pipeline",
        shard_count=8,
        lease_s=LEASE_S,
    ) as node:
        task = next(t for t in asyncio.all_tasks() if t.get_name() == "test-node")
        probe = Pipeline(node, task, collector, database_url)
        yield probe
        await probe.close()


@pytest.mark.parametrize("path", ["single", "batch", "enqueue"])
async def test_every_accepted_job_reaches_its_end_and_the_node_stays_up(
    pipeline: Pipeline, path: str
) -> None:
    @PIPELINE
    @given(batch=st.lists(jobs, min_size=1, max_size=4))
    def accepted_jobs_end(batch: list[dict[str, Any]]) -> None:
        pipeline.example(path, batch)

    await asyncio.to_thread(accepted_jobs_end)
    print(f"\n{path}: ends {pipeline.ends}")
    assert pipeline.ends.get("dispatched", 0) > 0


# --- dependencies -------------------------------------------------------------------------------

FINAL = {"succeeded", "dead", "cancelled"}


@dataclass(frozen=True)
class Planned:
    after: tuple[int, ...]  # indexes of earlier jobs of the example
    outcome: str  # what the test's consumer reports once the job is delivered


@st.composite
def dependency_graphs(draw: st.DrawFn) -> list[Planned]:
    """2-6 jobs, each after any subset of the earlier ones, each succeeding or dying."""
    size = draw(st.integers(2, 6))
    return [
        Planned(
            after=tuple(
                draw(st.lists(st.integers(0, index - 1), unique=True, max_size=index))
                if index
                else []
            ),
            outcome=draw(st.sampled_from(["succeeded", "dead"])),
        )
        for index in range(size)
    ]


def expected_ends(graph: list[Planned]) -> list[str]:
    """A job fires only once every job it waits for succeeded; one dying cancels what waits for
    it, and so on down the graph."""
    ends: list[str] = []
    for planned in graph:
        if all(ends[index] == "succeeded" for index in planned.after):
            ends.append(planned.outcome)
        else:
            ends.append("cancelled")
    return ends


async def test_every_job_of_a_dependency_graph_reaches_the_end_its_prerequisites_decide(
    pipeline: Pipeline, amqp_url: str
) -> None:
    reporter = EventReporter(amqp_url, group="property", consumer="property-test")
    reporter.open()

    async def run_graph(graph: list[Planned]) -> None:
        ids: list[str] = []
        for planned in graph:  # one by one: a job may only wait for jobs stored before it
            body = {
                "routing_key": "deps.work",
                "payload": len(ids),
                "after": [ids[index] for index in planned.after],
            }
            answer = await pipeline.http.post("/v1/jobs", json=body)
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        wanted = expected_ends(graph)
        reported: set[str] = set()
        deadline = time.monotonic() + LEASE_S + 20
        while True:
            states = [(await pipeline.http.get(f"/v1/jobs/{job_id}")).json() for job_id in ids]
            for planned, job in zip(graph, states, strict=True):
                delivered = job["id"] in pipeline.collector.deliveries
                if delivered and job["id"] not in reported:  # the consumer's verdict
                    [delivery] = pipeline.collector.deliveries[job["id"]]
                    reporter.report(
                        job_id=job["id"],
                        routing_key=job["routing_key"],
                        attempt=1,
                        outcome=planned.outcome,
                        error="planned" if planned.outcome == "dead" else None,
                        dispatch_round=str(delivery.headers[contract.HEADER_ROUND]),
                    )
                    reported.add(job["id"])
            if all(job["state"] in FINAL for job in states):
                break
            assert time.monotonic() < deadline, [job["state"] for job in states]
            await asyncio.sleep(0.1)
        assert [job["state"] for job in states] == wanted
        for job, end in zip(states, wanted, strict=True):
            assert (job["id"] in pipeline.collector.deliveries) == (end != "cancelled"), job
        await pipeline.check_alive()

    @PIPELINE
    @given(graph=dependency_graphs())
    def graphs_end(graph: list[Planned]) -> None:
        pipeline.run(lambda: run_graph(graph))

    try:
        await asyncio.to_thread(graphs_end)
    finally:
        await reporter.close(5)
