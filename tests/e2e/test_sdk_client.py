"""Every method of DispatcherClient and of SyncDispatcherClient against a real dispatcher process:
each test body runs once with the async client and once with the sync one (its calls run in a
thread), so both are held to the same behaviour; and once with the recording fake, which must
answer as the node does."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from consumers_sdk import (
    Consumer,
    DispatcherClient,
    InvalidJob,
    InvalidSchedule,
    Job,
    JobConflict,
    JobNotFound,
    JobRecord,
    Reject,
    Schedule,
    ScheduleConflict,
    ScheduleNotFound,
    SyncDispatcherClient,
)
from consumers_sdk.client import job_body
from consumers_sdk.errors import BulkActionConflict, BulkActionNotFound, InvalidBulkAction
from consumers_sdk.testing import RecordingClient
from devstack.dispatcher_process import DispatcherProcess
from tests.support.consumers import running
from tests.support.process import served
from tests.support.waiting import until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]
MAX_BATCH = 3


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    yield from served(
        tmp_path, database_url, amqp_url, env={"DISPATCHER_MAX_BATCH": str(MAX_BATCH)}
    )


class InThread:
    """The sync client's methods run in a worker thread and awaited, so one async test body
    drives both clients; ``list`` is drained in the thread (each page is a blocking request)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._target, name)
        if name in ("schedules", "bulk"):
            return InThread(found)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if name == "list":
                return await asyncio.to_thread(lambda: list(found(*args, **kwargs)))
            return await asyncio.to_thread(found, *args, **kwargs)

        return call


async def everything(listing: Any) -> list[Any]:
    """What ``client.list(...)`` gives: an async iterator, or (sync client) the drained list."""
    if hasattr(listing, "__aiter__"):
        return [item async for item in listing]
    return list(await listing)


@pytest.fixture(params=["async", "sync", "fake"])
def flavour(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Which client, and the URL of its dispatcher (started only for the real clients)."""
    if request.param == "fake":
        return "fake", ""
    dispatcher: DispatcherProcess = request.getfixturevalue("dispatcher")
    return request.param, dispatcher.url


@pytest.fixture
async def sdk(flavour: tuple[str, str]) -> AsyncIterator[Any]:
    kind, url = flavour
    if kind == "fake":
        async with RecordingClient(max_batch=MAX_BATCH) as fake:
            yield fake
    elif kind == "async":
        async with DispatcherClient(url, retries=2) as client:
            yield client
    else:
        with SyncDispatcherClient(url, retries=2) as sync_client:
            yield InThread(sync_client)


@asynccontextmanager
async def rejecting(amqp_url: str, routing_key: str) -> AsyncIterator[None]:
    """A consumer that rejects every job of ``routing_key``: each one dies at its first try."""
    consumer = Consumer(amqp_url, group=f"g{uuid.uuid4().hex[:8]}")

    @consumer.handler(routing_key)
    async def reject(job: Job) -> None:
        raise Reject("refused by the test")

    async with running(consumer):
        yield


async def test_every_job_method_returns_records_and_raises_typed_errors(
    sdk: Any, amqp_url: str
) -> None:
    key = f"sdk.{uuid.uuid4().hex[:12]}"
    job = await sdk.schedule(key, {"n": 0}, delay=600, ttl=3600.5, idempotency_key=f"{key}-0")
    assert isinstance(job, JobRecord)
    assert (job.state, job.created, job.ttl_ms, job.payload) == (
        "scheduled",
        True,
        3600500,
        {"n": 0},
    )
    assert timedelta(seconds=590) < job.run_at - job.created_at < timedelta(seconds=610)
    again = await sdk.schedule(key, {"n": 0}, delay=600, idempotency_key=f"{key}-0")
    assert (again.id, again.created) == (job.id, False)

    fetched = await sdk.get(job.id)
    assert [step.event for step in fetched.history] == ["scheduled"]
    assert fetched.history[0].at.tzinfo is not None

    for n in range(1, 5):
        await sdk.schedule(key, {"n": n}, delay=timedelta(minutes=10))
    listed = await everything(sdk.list(routing_key=key, state="scheduled", page_size=2))
    assert [item.payload["n"] for item in listed] == [0, 1, 2, 3, 4]  # five jobs over three pages
    page = await sdk.list_page(routing_key=key, limit=2)
    assert len(page.jobs) == 2
    assert page.next_after == page.jobs[-1].id
    by_key = await everything(sdk.list(idempotency_key=f"{key}-0"))
    assert [item.id for item in by_key] == [job.id]

    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    moved = await sdk.reschedule(job.id, run_at=later, priority=7, payload={"n": "moved"})
    assert (moved.run_at, moved.priority, moved.payload) == (later, 7, {"n": "moved"})
    moved = await sdk.reschedule(job.id, delay=timedelta(hours=1), priority=None)
    assert moved.priority is None
    assert moved.run_at < later

    cancelled = await sdk.cancel(job.id)
    assert cancelled.state == "cancelled"
    with pytest.raises(JobConflict) as conflict:
        await sdk.cancel(job.id)
    assert conflict.value.state == "cancelled"
    with pytest.raises(JobConflict):
        await sdk.reschedule(job.id, delay=5)
    with pytest.raises(JobNotFound):
        await sdk.get(str(uuid.uuid4()))
    with pytest.raises(InvalidJob) as invalid:
        await sdk.schedule("orders.*", 1)
    assert invalid.value.body["fields"][0]["field"] == "routing_key"

    if isinstance(sdk, RecordingClient):  # no broker: the fake is told what a consumer did
        doomed = await sdk.schedule(key, {"n": "doomed"})
        sdk.mark(doomed.id, "dead", error="Reject: refused by the test")
    else:
        async with rejecting(amqp_url, key):
            doomed = await sdk.schedule(key, {"n": "doomed"})

            async def dead() -> bool:
                return bool((await sdk.get(doomed.id)).state == "dead")

            await until(dead, 60)
    requeued = await sdk.requeue(doomed.id)
    assert requeued.state == "scheduled"
    assert requeued.id == doomed.id
    with pytest.raises(JobConflict):
        await sdk.requeue(doomed.id)  # no longer dead


async def test_listing_by_a_routing_key_prefix_answers_those_words_and_below(sdk: Any) -> None:
    key = f"sdk{uuid.uuid4().hex[:12]}"
    for routing_key in (f"{key}.charge", f"{key}x.charge", f"{key}.refund.late", key):
        await sdk.schedule(routing_key, 1, delay=600)
    listed = await everything(sdk.list(routing_key_prefix=f"{key}.", page_size=2))
    assert [job.routing_key for job in listed] == [f"{key}.charge", f"{key}.refund.late", key]
    for refused in ({"routing_key": key}, {"routing_key_prefix": f"{key}%"}):
        with pytest.raises(InvalidJob) as invalid:
            await sdk.list_page(**{"routing_key_prefix": key, **refused})
        assert invalid.value.body["fields"][0]["field"] == "routing_key_prefix"


async def test_scheduled_jobs_list_in_due_order_every_job_in_creation_order(sdk: Any) -> None:
    key = f"sdk.due{uuid.uuid4().hex[:12]}"
    for n in range(5):  # the last made is due first
        await sdk.schedule(key, {"n": n}, delay=timedelta(minutes=30 - n))
    due = await everything(sdk.list(routing_key=key, state="scheduled", page_size=2))
    assert [job.payload["n"] for job in due] == [4, 3, 2, 1, 0]
    made = await everything(sdk.list(routing_key=key, page_size=2))
    assert [job.payload["n"] for job in made] == [0, 1, 2, 3, 4]


async def test_schedule_many_sends_chunks_and_names_what_the_failed_chunk_left_stored(
    sdk: Any,
) -> None:
    key = f"batch.{uuid.uuid4().hex[:12]}"
    bodies = [job_body(key, {"n": n}, delay=600, idempotency_key=f"{key}-{n}") for n in range(7)]
    stored = await sdk.schedule_many(bodies, chunk_size=MAX_BATCH)  # chunks of 3, 3 and 1
    assert [job.payload["n"] for job in stored] == list(range(7))
    assert all(job.created for job in stored)

    other = f"batch.{uuid.uuid4().hex[:12]}"
    bodies = [job_body(other, {"n": n}, delay=600) for n in range(8)]
    bodies[4] = job_body("orders.*", {"n": 4})  # the second chunk (jobs 3 to 5) is refused
    with pytest.raises(InvalidJob) as refused:
        await sdk.schedule_many(bodies, chunk_size=MAX_BATCH)
    assert [job.payload["n"] for job in refused.value.stored] == [0, 1, 2]
    assert refused.value.body["fields"][0]["field"] == "jobs[4].routing_key"  # the caller's index
    assert "the 3 jobs before it were stored" in str(refused.value)
    kept = await everything(sdk.list(routing_key=other))
    assert [job.payload["n"] for job in kept] == [0, 1, 2]  # neither the refused chunk nor later

    with pytest.raises(InvalidJob) as too_big:  # a chunk larger than the node's batch limit
        await sdk.schedule_many(bodies[:4], chunk_size=MAX_BATCH + 1)
    assert too_big.value.body["fields"][0]["field"] == "jobs"
    assert too_big.value.stored == ()


def detail(run_at: datetime) -> str:
    """A replace's or extend's history detail, as the node writes it."""
    return f"run_at {run_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%fZ}"


async def test_a_known_key_keeps_replaces_extends_or_lets_go_as_the_node_does(sdk: Any) -> None:
    key = f"levers.{uuid.uuid4().hex[:12]}"
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    first = await sdk.schedule(key, {"v": 1}, run_at=later, priority=3, idempotency_key=f"{key}-a")
    assert (first.outcome, first.release_key, first.key_released) == ("created", "never", False)
    replaced = await sdk.schedule(
        key,
        {"v": 2},
        run_at=later + timedelta(minutes=10),
        headers={"h": "x"},
        idempotency_key=f"{key}-a",
        on_existing="replace",
    )
    assert (replaced.id, replaced.created, replaced.outcome) == (first.id, False, "replaced")
    assert (replaced.payload, replaced.headers, replaced.priority) == ({"v": 2}, {"h": "x"}, None)
    sooner = await sdk.schedule(
        key, {"v": 3}, run_at=later, idempotency_key=f"{key}-a", on_existing="extend"
    )
    assert (sooner.outcome, sooner.run_at) == ("kept", later + timedelta(minutes=10))
    [extended, new] = await sdk.schedule_many(
        [
            job_body(
                key,
                {"v": 4},
                run_at=later + timedelta(minutes=20),
                idempotency_key=f"{key}-a",
                on_existing="extend",
            ),
            job_body(key, {"v": 5}, run_at=later, idempotency_key=f"{key}-new"),
        ]
    )
    assert (extended.outcome, extended.payload) == ("extended", {"v": 2})  # the time only
    assert (new.outcome, new.created) == ("created", True)
    refused = await sdk.schedule(
        f"{key}.other", {}, run_at=later, idempotency_key=f"{key}-a", on_existing="extend"
    )
    assert (refused.outcome, refused.routing_key) == ("refused", key)
    history = (await sdk.get(first.id)).history
    assert [(step.event, step.detail) for step in history] == [
        ("scheduled", None),
        ("replaced", detail(later + timedelta(minutes=10))),
        ("extended", detail(later + timedelta(minutes=20))),
    ]

    # Due now: one lets go of its key once dispatched, the other keeps it and is never changed.
    sent = await sdk.schedule(key, "sent", idempotency_key=f"{key}-b", release_key="dispatched")
    done = await sdk.schedule(key, "done", idempotency_key=f"{key}-c")
    assert (sent.release_key, sent.key_released) == ("dispatched", False)
    if isinstance(sdk, RecordingClient):  # no broker: the fake is told of the dispatch
        sdk.mark(sent.id, "dispatched")
        sdk.mark(done.id, "dispatched")
    else:

        async def dispatched() -> bool:
            states = {(await sdk.get(job.id)).state for job in (sent, done)}
            return states == {"dispatched"}

        await until(dispatched, 60)
    again = await sdk.schedule(key, "again", run_at=later, idempotency_key=f"{key}-b")
    assert (again.created, again.outcome) == (True, "created")
    assert again.id != sent.id
    assert (await sdk.get(sent.id)).key_released is True
    by_key = await everything(sdk.list(idempotency_key=f"{key}-b"))
    assert [(job.id, job.key_released) for job in by_key] == [(again.id, False), (sent.id, True)]
    late = await sdk.schedule(
        key, "late", run_at=later, idempotency_key=f"{key}-c", on_existing="replace"
    )
    assert (late.id, late.outcome, late.payload) == (done.id, "refused", "done")

    with pytest.raises(InvalidJob) as keyless:
        await sdk.schedule(key, {}, release_key="finished")
    assert [f["field"] for f in keyless.value.body["fields"]] == ["release_key"]
    unknown: dict[str, Any] = {"idempotency_key": f"{key}-d", "on_existing": "overwrite"}
    with pytest.raises(InvalidJob) as in_batch:
        await sdk.schedule_many([job_body(key, {}, **unknown)])
    assert [f["field"] for f in in_batch.value.body["fields"]] == ["jobs[0].on_existing"]


async def finished(sdk: Any, action: Any) -> Any:
    """The action once done: the node's runner works it in the background, the fake at once."""
    found = action

    async def done() -> bool:
        nonlocal found
        found = await sdk.bulk.get(action.id)
        return bool(found.status == "done")

    await until(done, 60)
    return found


async def test_bulk_actions_match_change_and_refuse_as_the_node_does(
    sdk: Any, amqp_url: str
) -> None:
    key = f"bulk.{uuid.uuid4().hex[:12]}"
    jobs = [await sdk.schedule(key, {"n": n}, delay=600) for n in range(3)]
    below = await sdk.schedule(f"{key}.below", {}, delay=600)
    await sdk.schedule(f"{key}x", {}, delay=600)  # not below the words of the key
    dry = await sdk.bulk.dry_run("cancel", filter={"routing_key_prefix": key})
    assert (dry.action, dry.matched) == ("cancel", 4)
    assert [job.id for job in dry.sample] == sorted(job.id for job in [*jobs, below])

    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    window = {"routing_key": key, "run_at_to": datetime.now(UTC) + timedelta(hours=1)}
    moved = await finished(sdk, await sdk.bulk.start("reschedule", filter=window, run_at=later))
    assert (moved.touched, moved.matched_estimate, moved.run_at) == (3, 3, later)
    assert (moved.created_by, dict(moved.filter)) == (
        "open",
        {
            "states": ["scheduled", "waiting"],
            "routing_key": key,
            "run_at_to": window["run_at_to"].isoformat().replace("+00:00", "Z"),
        },
    )
    step = (await sdk.get(jobs[0].id)).history[-1]
    assert (step.event, step.detail, step.consumer is not None) == (
        "rescheduled",
        f"bulk action {moved.id}: reschedule to {later:%Y-%m-%dT%H:%M:%S}.000Z",
        True,
    )
    assert (await sdk.get(jobs[1].id)).run_at == later

    cancelled = await finished(
        sdk, await sdk.bulk.start("cancel", filter={"routing_key_prefix": f"{key}."})
    )
    assert cancelled.touched == 4
    states = {(await sdk.get(job.id)).state for job in [*jobs, below]}
    assert states == {"cancelled"}
    step = (await sdk.get(below.id)).history[-1]
    assert (step.event, step.detail) == ("cancelled", f"bulk action {cancelled.id}: cancel")
    listed = {action.id for action in await sdk.bulk.list(limit=1000)}
    assert {moved.id, cancelled.id} <= listed  # the node's ids are random: no order asserted
    for verb in (sdk.bulk.stop, sdk.bulk.resume):
        with pytest.raises(BulkActionConflict) as conflict:
            await verb(cancelled.id)
        assert conflict.value.body["state"] == "done"
    with pytest.raises(BulkActionNotFound):
        await sdk.bulk.get(str(uuid.uuid4()))
    with pytest.raises(InvalidBulkAction) as refused:
        await sdk.bulk.dry_run("cancel", filter={"state": "dead"})
    assert [f["field"] for f in refused.value.body["fields"]] == ["filter.state"]
    with pytest.raises(InvalidBulkAction) as refused:
        await sdk.bulk.start("cancel", filter={"finished_from": datetime.now(UTC)})
    assert [f["field"] for f in refused.value.body["fields"]] == ["filter.finished_from"]
    with pytest.raises(InvalidBulkAction) as refused:
        await sdk.bulk.start("reschedule", shift=0)
    assert [f["field"] for f in refused.value.body["fields"]] == ["shift_s"]

    dead_key = f"{key}.dead"
    if isinstance(sdk, RecordingClient):  # no broker: the fake is told what a consumer did
        doomed = await sdk.schedule(dead_key, {})
        sdk.mark(doomed.id, "dead", error="Reject: refused by the test")
    else:
        async with rejecting(amqp_url, dead_key):
            doomed = await sdk.schedule(dead_key, {})

            async def dead() -> bool:
                return bool((await sdk.get(doomed.id)).state == "dead")

            await until(dead, 60)
    spec = {"routing_key": dead_key, "error_contains": "REFUSED BY"}
    assert (await sdk.bulk.dry_run("requeue", filter=spec)).matched == 1
    requeued = await finished(sdk, await sdk.bulk.start("requeue", filter=spec))
    assert requeued.touched == 1
    history = (await sdk.get(doomed.id)).history
    steps = [step.detail for step in history if step.event == "requeued"]
    assert steps == [f"bulk action {requeued.id}: requeue"]


async def test_every_schedule_method_returns_records_and_raises_typed_errors(sdk: Any) -> None:
    name = f"nightly-{uuid.uuid4().hex[:8]}"
    created = await sdk.schedules.create(
        name,
        "reports.nightly",
        {"report": "sales"},
        interval=timedelta(hours=1),
        grace=30,
        ttl=timedelta(minutes=5),
        missed="skip",
    )
    assert isinstance(created, Schedule)
    assert (created.name, created.interval_s, created.cron, created.grace_s) == (
        name,
        3600,
        None,
        30,
    )
    assert (created.missed, created.job.ttl_ms, created.job.payload) == (
        "skip",
        300_000,
        {"report": "sales"},
    )
    with pytest.raises(ScheduleConflict):
        await sdk.schedules.create(name, "reports.nightly", {}, interval=60)
    with pytest.raises(InvalidSchedule) as invalid:
        await sdk.schedules.create(f"{name}-x", "reports.nightly", {})  # neither cron nor interval
    assert invalid.value.body["fields"][0]["field"] == "cron"

    fetched = await sdk.schedules.get(name)
    assert len(fetched.upcoming) == 5
    assert fetched.upcoming[1] - fetched.upcoming[0] == timedelta(hours=1)
    assert name in [schedule.name for schedule in await everything(sdk.schedules.list(page_size=1))]

    changed = await sdk.schedules.change(
        name,
        cron="30 2 * * *",
        timezone="Europe/Paris",
        job=dataclasses.replace(created.job, payload={"v": 2}),
    )
    assert (changed.cron, changed.interval_s, changed.timezone) == (
        "30 2 * * *",
        None,
        "Europe/Paris",
    )
    assert changed.job.payload == {"v": 2}
    assert changed.job.ttl_ms == 300_000  # the rest of the template kept
    assert (await sdk.schedules.pause(name)).paused is True
    assert (await sdk.schedules.get(name)).upcoming == ()  # none while paused
    resumed = await sdk.schedules.resume(name)
    assert resumed.paused is False
    assert resumed.next_at is not None or isinstance(sdk, RecordingClient)  # cron: not planned

    deleted = await sdk.schedules.delete(name)
    assert deleted.name == name
    with pytest.raises(ScheduleNotFound):
        await sdk.schedules.get(name)
    with pytest.raises(ScheduleNotFound):
        await sdk.schedules.delete(name)


async def test_the_sync_example_schedules_through_the_url_the_docs_name(
    dispatcher: DispatcherProcess,
) -> None:
    produced = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "examples.sync_producer", "2"],
        cwd=ROOT,
        env={**os.environ, "DISPATCHER_URL": dispatcher.url},
        capture_output=True,
        text=True,
        check=True,
    )
    ids = [line.split()[1] for line in produced.stdout.splitlines() if line.startswith("scheduled")]
    assert len(ids) == 2
    async with DispatcherClient(dispatcher.url) as client:
        stored = [await client.get(job_id) for job_id in ids]
    assert [job.payload for job in stored] == [{"order": 0}, {"order": 1}]
    assert {job.idempotency_key for job in stored} == {"order-0-expiry-sync", "order-1-expiry-sync"}
