"""Consumer events tied to the dispatch round they report on: forged or stale events are kept as
ignored and change nothing; a consumer's own events count, even one recorded before the confirm."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest

from consumers_sdk import Consumer, Job, Reject, ids, reporter
from dispatcher import models
from dispatcher.node import Node
from dispatcher.store.db import Database
from dispatcher.store.history import HistoryStore
from dispatcher.store.jobs import JobStore
from dispatcher.store.queries import scheduler
from dispatcher.store.shards import ShardStore
from tests.integration.test_consumer import TIERS
from tests.support import dispatched
from tests.support.consumers import running
from tests.support.nodes import client, running_node
from tests.support.waiting import eventually, ignored_steps, job_when, until

# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version


ROUTING_KEY = dispatched.ROUTING_KEY


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, node_id="rounds", shard_count=4
    ) as running_one:
        yield running_one


async def forge(amqp_url: str, job_id: str, reports: list[dict[str, Any]]) -> None:
    """Publish events as any user allowed to write to the events exchange could."""
    forger = reporter.EventReporter(amqp_url, group="mallory", consumer="mallory-1")
    forger.open()
    for report in reports:
        forger.report(job_id=job_id, attempt=1, outcome="dead", error="forged", **report)
    await forger.close(20)
    assert forger.pending == 0


async def submit(http: httpx.AsyncClient, **fields: object) -> str:
    job = {"routing_key": ROUTING_KEY, "payload": 1, **fields}
    answer = await http.post("/v1/jobs", json=job)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def ignored_total(metrics: str, reason: str) -> float:
    prefix = f'dispatcher_events_ignored_total{{reason="{reason}"}} '
    lines = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


async def test_forged_dead_events_change_nothing_and_are_kept_as_ignored_then_the_own_counts(
    node: Node, amqp_url: str, database_url: str
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS, name="worker-1")

    @consumer.handler(ROUTING_KEY)
    async def charge(job: Job) -> None:
        started.set()
        await release.wait()

    async with running(consumer), client(node) as http:
        job_id = await submit(http)
        waiting = await submit(http, routing_key="billing.after", after=[job_id])
        await eventually(started.is_set, 30)
        await job_when(http, job_id, "dispatched")
        real = await dispatched.dispatch_round(database_url, job_id)
        await forge(
            amqp_url,
            job_id,
            [
                {"routing_key": ROUTING_KEY, "dispatch_round": None},
                {"routing_key": ROUTING_KEY, "dispatch_round": str(uuid.uuid4())},
                {"routing_key": "payments.charge", "dispatch_round": str(real)},
            ],
        )
        assert sorted(await ignored_steps(http, job_id, 3)) == [
            ("dead", "no_round"),
            ("dead", "other_round"),
            ("dead", "routing_key"),
        ]
        assert await dispatched.state_of(database_url, job_id) == ("dispatched", None)
        assert (await http.get(f"/v1/jobs/{waiting}")).json()["state"] == "waiting"
        metrics = (await http.get("/metrics")).text
        for reason in ("no_round", "other_round", "routing_key"):
            assert ignored_total(metrics, reason) == 1

        release.set()
        done = await job_when(http, job_id, "succeeded")
        assert done["last_error"] is None
        own = [step for step in done["history"] if step["event"] == "succeeded"]
        assert [(step["consumer"], step["ignored"]) for step in own] == [("worker-1", None)]
        # The dependent is released by the consumer's own outcome only.
        await until(lambda: _state_is_not(http, waiting, "waiting"), 30)


async def _state_is_not(http: httpx.AsyncClient, job_id: str, state: str) -> bool:
    return bool((await http.get(f"/v1/jobs/{job_id}")).json()["state"] != state)


async def test_a_stale_dead_after_a_requeue_neither_stops_nor_ends_the_new_round(
    node: Node, amqp_url: str, database_url: str
) -> None:
    rounds: list[str | None] = []
    second, release = asyncio.Event(), asyncio.Event()
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS, name="worker-1")

    @consumer.handler(ROUTING_KEY)
    async def charge(job: Job) -> None:
        rounds.append(job.dispatch_round)
        if len(rounds) == 1:
            raise Reject("the first round fails")
        second.set()
        await release.wait()

    async with running(consumer), client(node) as http:
        job_id = await submit(http)
        dead = await job_when(http, job_id, "dead")
        assert dead["last_error"] == "Reject: the first round fails"
        assert (await http.post(f"/v1/jobs/{job_id}/requeue")).status_code == 200
        # A dead event of the first round, arriving late (a consumer's buffer, a redelivery).
        await forge(amqp_url, job_id, [{"routing_key": ROUTING_KEY, "dispatch_round": rounds[0]}])
        assert await ignored_steps(http, job_id, 1) == [("dead", "other_round")]
        await eventually(second.is_set, 30)  # the new round was published and delivered
        assert rounds[0] is not None
        assert rounds[1] not in (None, rounds[0])
        assert str(await dispatched.dispatch_round(database_url, job_id)) == rounds[1]
        await job_when(http, job_id, "dispatched")  # not ended by the stale dead

        release.set()
        done = await job_when(http, job_id, "succeeded")
    assert done["last_error"] is None


async def test_a_succeeded_recorded_while_dispatching_settles_the_job_and_the_confirm_keeps_it(
    db: Database, database_url: str
) -> None:
    jobs = JobStore(db, node_id="n1", lease_s=30)
    history = HistoryStore(db)
    shards = ShardStore(db)
    await shards.ensure(4)
    job_ids = ids.JobIds()
    stored = [
        models.NewJob(
            id=job_ids.next(),
            shard=0,
            spec=models.JobSpec(
                routing_key=ROUTING_KEY, payload=b"1", run_at=datetime.now(UTC), headers={}
            ),
        )
        for _ in range(3)
    ]
    await jobs.insert(stored)
    entries = [
        models.DueEntry.make(job.spec.run_at.timestamp(), job.id, job.shard) for job in stored
    ]
    claimed = (await jobs.claim(entries, await shards.bump([0], "n1"))).jobs
    by_id = {job.id: job for job in claimed}
    fast, forged, quiet = (by_id[job.id] for job in stored)

    recorded = await history.record(
        [
            dispatched.event(fast.id, "succeeded", dispatch_round=fast.dispatch_round),
            dispatched.event(forged.id, "dead", dispatch_round=uuid.uuid4(), error="forged"),
        ]
    )
    assert [entry.ignored for entry in recorded] == [None, "other_round"]
    # An event of the job's round proves the message left: the job is settled before its
    # confirm is marked; one of another round changes nothing.
    assert await dispatched.state_of(database_url, fast.id) == ("succeeded", None)
    assert await dispatched.state_of(database_url, forged.id) == ("dispatching", None)

    await jobs.mark_dispatched([fast.id, forged.id, quiet.id])
    assert await dispatched.state_of(database_url, fast.id) == ("succeeded", None)
    assert await dispatched.state_of(database_url, forged.id) == ("dispatched", None)
    assert await dispatched.state_of(database_url, quiet.id) == ("dispatched", None)


async def claimed_job(db: Database) -> models.ClaimedJob:
    jobs = JobStore(db, node_id="n1", lease_s=30)
    shards = ShardStore(db)
    await shards.ensure(4)
    job = models.NewJob(
        id=ids.JobIds().next(),
        shard=0,
        spec=models.JobSpec(
            routing_key=ROUTING_KEY, payload=b"1", run_at=datetime.now(UTC), headers={}
        ),
    )
    await jobs.insert([job])
    entry = models.DueEntry.make(job.spec.run_at.timestamp(), job.id, job.shard)
    [claimed] = (await jobs.claim([entry], await shards.bump([0], "n1"))).jobs
    return claimed


@pytest.mark.parametrize("first", ["recording", "confirm"])
async def test_a_succeeded_recorded_during_the_confirm_is_the_state_after_both(
    db: Database, database_url: str, first: str
) -> None:
    """The recording of a fast consumer's outcome and the confirm's mark, at once: whichever
    takes the job's row first, the other waits for it, and the job ends succeeded (the
    recording's snapshot saw it dispatching either way)."""
    job = await claimed_job(db)
    event = dispatched.event(job.id, "succeeded", dispatch_round=job.dispatch_round)
    history = HistoryStore(db)
    recording = await asyncpg.connect(database_url)
    confirming = await asyncpg.connect(database_url)
    try:
        recorded, confirmed = recording.transaction(), confirming.transaction()
        await recorded.start()
        await confirmed.start()
        if first == "recording":
            await history._record(recording, [event], [None])
            second = asyncio.create_task(confirming.execute(scheduler.MARK_DISPATCHED, [job.id]))
            await asyncio.sleep(0.5)
            assert not second.done(), "the confirm waits for the recording's row"
            await recorded.commit()
            await second
            await confirmed.commit()
        else:
            await confirming.execute(scheduler.MARK_DISPATCHED, [job.id])
            second = asyncio.create_task(history._record(recording, [event], [None]))
            await asyncio.sleep(0.5)
            assert not second.done(), "the recording waits for the confirm's row"
            await confirmed.commit()
            await second
            await recorded.commit()
    finally:
        await recording.close()
        await confirming.close()
    assert await dispatched.state_of(database_url, job.id) == ("succeeded", None)


async def test_an_outcome_of_its_round_settles_a_job_released_after_its_publish(
    db: Database, database_url: str
) -> None:
    """A publish whose confirm did not come in time is released, and the job scheduled again,
    though the message may be in the queue: when its consumer reports, the job is settled and
    no claim fires it a second time."""
    job = await claimed_job(db)
    jobs = JobStore(db, node_id="n1", lease_s=30)
    await jobs.release([job.id])
    assert await dispatched.state_of(database_url, job.id) == ("scheduled", None)
    await HistoryStore(db).record(
        [dispatched.event(job.id, "succeeded", dispatch_round=job.dispatch_round)]
    )
    assert await dispatched.state_of(database_url, job.id) == ("succeeded", None)
    entry = models.DueEntry.make(job.run_at.timestamp(), job.id, job.shard)
    epochs = await ShardStore(db).bump([job.shard], "n1")
    assert (await jobs.claim([entry], epochs)).jobs == []


async def test_no_event_settles_a_scheduled_job_stored_before_rounds(
    db: Database, database_url: str
) -> None:
    """A job stored before rounds (0011) and never claimed has none to prove its message went
    out: an event without one leaves it scheduled (after a claim gives it one, its round
    counts)."""
    job_id, none = await dispatched.insert_dispatched(
        database_url, state="scheduled", with_round=False
    )
    assert none is None
    await HistoryStore(db).record([dispatched.event(job_id, "succeeded", dispatch_round=None)])
    assert await dispatched.state_of(database_url, job_id) == ("scheduled", None)


async def test_a_claim_gives_a_round_to_a_job_stored_before_rounds_and_a_requeue_renews_it(
    db: Database, database_url: str
) -> None:
    jobs = JobStore(db, node_id="n1", lease_s=30)
    shards = ShardStore(db)
    await shards.ensure(4)
    job_id, none = await dispatched.insert_dispatched(
        database_url, state="scheduled", with_round=False
    )
    assert none is None
    [claimed] = (
        await jobs.claim(
            [models.DueEntry.make(datetime.now(UTC).timestamp() + 1, job_id, 0)],
            await shards.bump([0], "n1"),
        )
    ).jobs
    assert claimed.dispatch_round is not None
    assert await dispatched.dispatch_round(database_url, job_id) == claimed.dispatch_round
    await jobs.mark_dispatched([job_id])
    await HistoryStore(db).record(
        [dispatched.event(job_id, "dead", dispatch_round=claimed.dispatch_round)]
    )
    await jobs.requeue(job_id, shard=0)
    renewed = await dispatched.dispatch_round(database_url, job_id)
    assert renewed not in (None, claimed.dispatch_round)


async def test_a_job_dispatched_before_rounds_keeps_accepting_events_without_one(
    db: Database, database_url: str
) -> None:
    """Decision: otherwise an upgrade would strand every job in flight in ``dispatched``."""
    job_id, _ = await dispatched.insert_dispatched(database_url, with_round=False)
    history = HistoryStore(db)
    [guessed] = await history.record(
        [dispatched.event(job_id, "dead", dispatch_round=uuid.uuid4(), error="guessed")]
    )
    assert guessed.ignored == "other_round"
    [legacy] = await history.record(
        [dispatched.event(job_id, "dead", dispatch_round=None, error="ValueError: x")]
    )
    assert legacy.ignored is None
    assert await dispatched.state_of(database_url, job_id) == ("dead", "ValueError: x")
