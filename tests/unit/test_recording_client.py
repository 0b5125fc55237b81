"""The recording fake clients: the real clients' methods and records, answered in memory, with
what was done kept for a test, and the node's refusals raised as the same typed errors."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumers_sdk import (
    DispatcherClient,
    InvalidJob,
    InvalidSchedule,
    JobConflict,
    JobNotFound,
    JobRecord,
    Schedule,
    ScheduleConflict,
    ScheduleNotFound,
    SyncDispatcherClient,
)
from consumers_sdk.client import BulkActions, Schedules, job_body
from consumers_sdk.errors import BulkActionConflict, BulkActionNotFound, InvalidBulkAction
from consumers_sdk.sync_client import SyncBulkActions, SyncSchedules
from consumers_sdk.testing import RecordingClient, RecordingSyncClient

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
# Every public method of the clients, each exercised below: a method the client gains fails
# test_the_fakes_offer_every_method_of_the_real_clients until the fake is tested with it.
JOB_METHODS = {
    "schedule",
    "schedule_many",
    "get",
    "list_page",
    "list",
    "reschedule",
    "cancel",
    "requeue",
    "job",
    "close",
}
SCHEDULE_METHODS = {"create", "get", "list_page", "list", "change", "pause", "resume", "delete"}
BULK_METHODS = {"dry_run", "start", "get", "list", "stop", "resume"}


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, callable)
        if not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("real", "fake", "expected"),
    [
        (DispatcherClient, RecordingClient, JOB_METHODS),
        (SyncDispatcherClient, RecordingSyncClient, JOB_METHODS),
        (Schedules, Schedules, SCHEDULE_METHODS),  # client.schedules is the real one on a fake
        (SyncSchedules, SyncSchedules, SCHEDULE_METHODS),
        (BulkActions, BulkActions, BULK_METHODS),  # client.bulk too
        (SyncBulkActions, SyncBulkActions, BULK_METHODS),
    ],
)
def test_the_fakes_offer_every_method_of_the_real_clients(
    real: type, fake: type, expected: set[str]
) -> None:
    assert set(public_methods(real)) == expected
    found = public_methods(fake)
    assert {name: found.get(name) for name in expected} == public_methods(real)


@pytest.fixture
def client() -> RecordingClient:
    return RecordingClient(max_batch=3, clock=lambda: NOW)


async def test_schedule_records_the_job_and_get_answers_it_as_scheduled(
    client: RecordingClient,
) -> None:
    job = await client.schedule(
        "orders.expire",
        {"order": 7},
        delay=timedelta(minutes=30),
        headers={"tenant": "acme"},
        idempotency_key="order-7-expiry",
        max_attempts=4,
    )
    assert isinstance(job, JobRecord)
    assert (job.state, job.created, job.run_at) == ("scheduled", True, NOW + timedelta(minutes=30))
    assert client.scheduled == [job]
    [recorded] = client.scheduled
    assert (recorded.routing_key, recorded.payload, recorded.idempotency_key) == (
        "orders.expire",
        {"order": 7},
        "order-7-expiry",
    )
    assert recorded.headers == {"tenant": "acme", "x-retry-max-attempts": 4}
    fetched = await client.get(job.id)
    assert fetched.state == "scheduled"
    assert [step.event for step in fetched.history] == ["scheduled"]


async def test_a_known_idempotency_key_answers_the_same_job_and_records_nothing(
    client: RecordingClient,
) -> None:
    first = await client.schedule("orders.expire", {"order": 1}, delay=60, idempotency_key="k")
    again = await client.schedule("orders.expire", {"order": 2}, delay=5, idempotency_key="k")
    assert (again.id, again.created, again.payload) == (first.id, False, {"order": 1})
    assert [job.id for job in client.scheduled] == [first.id]


async def test_refused_jobs_raise_the_nodes_typed_errors_and_store_nothing(
    client: RecordingClient,
) -> None:
    with pytest.raises(InvalidJob) as refused:
        await client.schedule("orders.*", {})
    assert refused.value.body["fields"][0]["field"] == "routing_key"
    with pytest.raises(InvalidJob) as reserved:
        await client.schedule("orders.expire", {}, headers={"x-job-id": "mine"})
    assert reserved.value.body["fields"][0]["field"].startswith("headers")
    with pytest.raises(JobNotFound):
        await client.get("01890000-0000-7000-8000-000000000000")
    assert client.scheduled == []
    assert [job async for job in client.list()] == []


async def test_cancel_and_reschedule_are_recorded_and_refused_once_past(
    client: RecordingClient,
) -> None:
    job = await client.schedule("orders.expire", {"order": 1}, delay=60)
    later = NOW + timedelta(hours=2)
    moved = await client.reschedule(job.id, run_at=later, priority=5, payload={"order": 2})
    assert (moved.run_at, moved.priority, moved.payload) == (later, 5, {"order": 2})
    assert (await client.reschedule(job.id, delay=10)).run_at == NOW + timedelta(seconds=10)
    cancelled = await client.cancel(job.id)
    assert cancelled.state == "cancelled"
    assert (await client.get(job.id)).state == "cancelled"
    assert [record.run_at for record in client.rescheduled] == [later, NOW + timedelta(seconds=10)]
    assert [record.id for record in client.cancelled] == [job.id]
    with pytest.raises(JobConflict) as conflict:
        await client.cancel(job.id)
    assert conflict.value.state == "cancelled"
    with pytest.raises(JobConflict):
        await client.reschedule(job.id, delay=5)
    assert len(client.cancelled) == 1


async def test_requeue_takes_only_a_dead_job_back(client: RecordingClient) -> None:
    job = await client.schedule("orders.expire", {})
    with pytest.raises(JobConflict) as conflict:
        await client.requeue(job.id)
    assert conflict.value.state == "scheduled"
    assert (
        client.mark(job.id, "dead", error="RuntimeError: boom").last_error == "RuntimeError: boom"
    )
    requeued = await client.requeue(job.id)
    assert (requeued.id, requeued.state) == (job.id, "scheduled")
    assert [step.event for step in (await client.get(job.id)).history] == [
        "scheduled",
        "dead",
        "requeued",
    ]
    assert [record.id for record in client.requeued] == [job.id]


async def test_a_job_waits_for_its_prerequisites_and_goes_when_they_succeed(
    client: RecordingClient,
) -> None:
    first = await client.schedule("orders.charge", {})
    second = await client.schedule("orders.ship", {}, after=[first.id])
    assert second.state == "waiting"
    assert (await client.get(second.id)).pending == (first.id,)
    client.mark(first.id, "succeeded")
    assert (await client.get(second.id)).state == "scheduled"
    with pytest.raises(InvalidJob) as unknown:
        await client.schedule("orders.ship", {}, after=["01890000-0000-7000-8000-000000000000"])
    assert unknown.value.body["fields"][0]["field"] == "after[0]"


async def test_list_follows_the_pages_with_the_filters(client: RecordingClient) -> None:
    for n in range(5):
        await client.schedule("orders.expire", {"n": n}, idempotency_key=f"k{n}")
    other = await client.schedule("orders.other", {"n": 9})
    await client.cancel(other.id)
    listed = [
        job.payload["n"] async for job in client.list(routing_key="orders.expire", page_size=2)
    ]
    assert listed == [0, 1, 2, 3, 4]
    page = await client.list_page(limit=2)
    assert page.next_after == page.jobs[-1].id
    assert [job.payload["n"] async for job in client.list(state="cancelled")] == [9]
    assert [job.payload["n"] async for job in client.list(idempotency_key="k3")] == [3]


async def test_schedule_many_stores_chunk_by_chunk_and_says_what_was_stored(
    client: RecordingClient,
) -> None:
    bodies = [job_body("orders.expire", {"n": n}) for n in range(7)]
    bodies[4] = job_body("orders.*", {"n": 4})
    with pytest.raises(InvalidJob) as refused:
        await client.schedule_many(bodies)  # chunks of 1000 > max_batch 3: the first is refused
    assert refused.value.body["fields"][0]["field"] == "jobs"
    with pytest.raises(InvalidJob) as partly:
        await client.schedule_many(bodies, chunk_size=3)
    assert [job.payload["n"] for job in partly.value.stored] == [0, 1, 2]
    assert partly.value.body["fields"][0]["field"] == "jobs[4].routing_key"
    assert [job.payload["n"] for job in client.scheduled] == [0, 1, 2]  # the chunk stored nothing
    with pytest.raises(InvalidJob) as repeated:
        await client.schedule_many([job_body("a", 1, idempotency_key="k")] * 2)
    assert repeated.value.body["fields"][0]["field"] == "jobs[1].idempotency_key"


async def test_the_job_decorator_schedules_through_the_fake(client: RecordingClient) -> None:
    @client.job("orders.expire", priority=3)
    def expire_order(order: int) -> int:
        return order

    assert expire_order(4) == 4
    job = await expire_order.schedule({"order": 4}, delay=1)
    assert (job.routing_key, job.priority) == ("orders.expire", 3)
    await client.close()


async def test_every_schedule_method_is_recorded_and_refused_as_the_node_does(
    client: RecordingClient,
) -> None:
    created = await client.schedules.create(
        "hourly", "reports.hourly", {"r": 1}, interval=timedelta(hours=1), grace=30
    )
    assert isinstance(created, Schedule)
    assert (created.interval_s, created.grace_s, created.next_at) == (3600, 30.0, NOW)
    upcoming = (await client.schedules.get("hourly")).upcoming
    assert upcoming[:2] == (NOW, NOW + timedelta(hours=1))
    with pytest.raises(ScheduleConflict):
        await client.schedules.create("hourly", "reports.hourly", {}, interval=60)
    with pytest.raises(InvalidSchedule) as invalid:
        await client.schedules.create("neither", "reports.hourly", {})
    assert invalid.value.body["fields"][0]["field"] == "cron"
    nightly = await client.schedules.create("nightly", "reports.nightly", {}, cron="30 2 * * *")
    assert (nightly.cron, nightly.next_at) == ("30 2 * * *", None)  # cron is not planned here

    changed = await client.schedules.change("hourly", cron="0 * * * *")
    assert (changed.cron, changed.interval_s) == ("0 * * * *", None)
    assert (await client.schedules.pause("hourly")).paused is True
    assert (await client.schedules.get("hourly")).upcoming == ()
    assert (await client.schedules.resume("hourly")).paused is False
    names = [schedule.name async for schedule in client.schedules.list(page_size=1)]
    assert names == ["hourly", "nightly"]
    assert (await client.schedules.list_page(limit=5)).next_after is None
    await client.schedules.delete("hourly")
    with pytest.raises(ScheduleNotFound):
        await client.schedules.get("hourly")

    assert [s.name for s in client.schedules_created] == ["hourly", "nightly"]
    assert [s.cron for s in client.schedules_changed] == ["0 * * * *"]
    assert [s.paused for s in client.schedules_paused + client.schedules_resumed] == [True, False]
    assert [s.name for s in client.schedules_deleted] == ["hourly"]


def test_the_sync_fake_records_as_the_async_one() -> None:
    with RecordingSyncClient(clock=lambda: NOW) as client:
        job = client.schedule("orders.expire", {"order": 1}, delay=30, idempotency_key="k")
        assert client.schedule("orders.expire", {}, idempotency_key="k").id == job.id
        assert [listed.id for listed in client.list()] == [job.id]
        client.cancel(job.id)
        with pytest.raises(JobConflict):
            client.cancel(job.id)
        client.schedules.create("s", "reports.x", {}, interval=60)
        client.schedules.pause("s")
        assert client.bulk.dry_run("cancel").matched == 0  # cancelled already
        assert client.bulk.start("cancel", filter={"routing_key": "orders.expire"}).touched == 0
    assert [action.action for action in client.bulk_started] == ["cancel"]
    assert [scheduled.run_at for scheduled in client.scheduled] == [NOW + timedelta(seconds=30)]
    assert [cancelled.state for cancelled in client.cancelled] == ["cancelled"]
    assert [paused.name for paused in client.schedules_paused] == ["s"]


async def test_a_known_key_replaces_or_extends_the_pending_job_as_the_node_does(
    client: RecordingClient,
) -> None:
    first = await client.schedule("users.remind", {"v": 1}, delay=60, idempotency_key="u1")
    replaced = await client.schedule(
        "users.remind",
        {"v": 2},
        delay=30,
        headers={"h": "x"},
        idempotency_key="u1",
        on_existing="replace",
    )
    assert (replaced.id, replaced.created, replaced.outcome) == (first.id, False, "replaced")
    assert (replaced.payload, replaced.headers, replaced.priority) == ({"v": 2}, {"h": "x"}, None)
    assert replaced.run_at == NOW + timedelta(seconds=30)  # earlier: a replace takes any time
    sooner = await client.schedule(
        "users.remind", {"v": 3}, delay=10, idempotency_key="u1", on_existing="extend"
    )
    assert (sooner.outcome, sooner.run_at) == ("kept", replaced.run_at)  # never earlier
    extended = await client.schedule(
        "users.remind", {"v": 4}, delay=90, idempotency_key="u1", on_existing="extend"
    )
    assert (extended.outcome, extended.run_at) == ("extended", NOW + timedelta(seconds=90))
    assert extended.payload == {"v": 2}  # extend moves the time only
    kept = await client.schedule("users.remind", {"v": 5}, delay=900, idempotency_key="u1")
    assert (kept.outcome, kept.run_at) == ("kept", extended.run_at)
    history = (await client.get(first.id)).history
    assert [(step.event, step.detail) for step in history] == [
        ("scheduled", None),
        ("replaced", "run_at 2030-01-01T12:00:30.000000Z"),
        ("extended", "run_at 2030-01-01T12:01:30.000000Z"),
    ]
    assert [job.payload for job in client.replaced] == [{"v": 2}]
    assert [job.run_at for job in client.extended] == [extended.run_at]
    assert [job.id for job in client.scheduled] == [first.id]


async def test_a_job_no_longer_pending_or_under_another_routing_key_is_refused_unchanged(
    client: RecordingClient,
) -> None:
    sent = await client.schedule("keys.sync", "sent", idempotency_key="done")
    client.mark(sent.id, "dispatched")
    other = await client.schedule("keys.a", "a", delay=60, idempotency_key="other")
    for how in ("replace", "extend"):
        late = await client.schedule(
            "keys.sync", "late", delay=60, idempotency_key="done", on_existing=how
        )
        assert (late.id, late.outcome, late.payload) == (sent.id, "refused", "sent")
        moved = await client.schedule(
            "keys.b", "b", delay=600, idempotency_key="other", on_existing=how
        )
        assert (moved.outcome, moved.run_at, moved.routing_key) == (
            "refused",
            other.run_at,
            "keys.a",
        )
    assert client.replaced == client.extended == []


@pytest.mark.parametrize("release", ["dispatched", "finished"])
async def test_a_job_lets_go_of_its_key_as_its_release_key_says(
    client: RecordingClient, release: str
) -> None:
    first = await client.schedule("keys.sync", 1, idempotency_key="k", release_key=release)
    assert (first.release_key, first.key_released) == (release, False)
    client.mark(first.id, "dispatched")
    again = await client.schedule("keys.sync", 2, delay=60, idempotency_key="k")
    if release == "finished":  # dispatched is not finished: the consumer reports the end
        assert (again.id, again.outcome) == (first.id, "kept")
        assert client.mark(first.id, "succeeded").key_released is True
        again = await client.schedule("keys.sync", 2, delay=60, idempotency_key="k")
    assert again.outcome == "created"
    assert again.id != first.id
    assert (await client.get(first.id)).key_released is True
    found = [job.id async for job in client.list(idempotency_key="k")]
    assert found == [again.id, first.id]  # the holder, then those that let go, newest first


async def test_a_cancelled_job_lets_go_of_a_key_released_when_finished(
    client: RecordingClient,
) -> None:
    first = await client.schedule(
        "keys.sync", 1, delay=60, idempotency_key="k", release_key="finished"
    )
    assert (await client.cancel(first.id)).key_released is True
    assert (await client.schedule("keys.sync", 2, idempotency_key="k")).outcome == "created"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"on_existing": "replace"}, "on_existing"),
        ({"release_key": "dispatched"}, "release_key"),
        ({"idempotency_key": "k", "on_existing": "overwrite"}, "on_existing"),
        ({"idempotency_key": "k", "release_key": "later"}, "release_key"),
    ],
)
async def test_bad_key_levers_are_refused_naming_the_field(
    client: RecordingClient, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidJob) as refused:
        await client.schedule("keys.x", 1, **options)
    assert [f["field"] for f in refused.value.body["fields"]] == [field]
    with pytest.raises(InvalidJob) as in_batch:
        await client.schedule_many([job_body("keys.x", 1, **options)])
    assert [f["field"] for f in in_batch.value.body["fields"]] == [f"jobs[0].{field}"]
    assert client.scheduled == []


async def test_a_batch_mixes_keep_replace_extend_and_new_keys(client: RecordingClient) -> None:
    for key in ("a", "b", "c"):
        await client.schedule("keys.sync", key, delay=60, idempotency_key=key)
    answered = await client.schedule_many(
        [
            job_body("keys.sync", "a2", delay=60, idempotency_key="a"),
            job_body("keys.sync", "b2", delay=30, idempotency_key="b", on_existing="replace"),
            job_body("keys.sync", "c2", delay=120, idempotency_key="c", on_existing="extend"),
        ]
    )
    assert [job.outcome for job in answered] == ["kept", "replaced", "extended"]
    assert [job.payload for job in answered] == ["a", "b2", "c"]


async def test_a_bulk_dry_run_counts_the_matches_and_shows_the_first_twenty_by_id(
    client: RecordingClient,
) -> None:
    wanted = [await client.schedule("billing.charge", {"n": n}) for n in range(22)]
    wanted.append(await client.schedule("billing", {}))
    await client.schedule("billingx", {})  # not below the words "billing"
    dry = await client.bulk.dry_run("cancel", filter={"routing_key_prefix": "billing."})
    assert (dry.action, dry.matched) == ("cancel", 23)
    assert [job.id for job in dry.sample] == [job.id for job in wanted[:20]]
    assert {job.state for job in await everything(client.list())} == {"scheduled"}
    assert (client.bulk_started, await client.bulk.list()) == ([], ())


async def everything(listing: Any) -> list[Any]:
    return [item async for item in listing]


async def test_a_bulk_cancel_is_applied_at_once_and_answered_done(
    client: RecordingClient,
) -> None:
    first = await client.schedule("orders.expire", {}, delay=600)
    waiting = await client.schedule("orders.notify", {}, after=[first.id])
    fired = await client.schedule("orders.expire", {})
    client.mark(fired.id, "dispatched")  # past cancelling: left alone
    started = await client.bulk.start("cancel", filter={"routing_key": "orders.expire"})
    assert (started.status, started.touched, started.matched_estimate) == ("done", 1, 1)
    assert started.filter == {"states": ["scheduled", "waiting"], "routing_key": "orders.expire"}
    assert (started.created_at, started.finished_at) == (NOW, NOW)
    states = [(await client.get(job.id)).state for job in (first, waiting, fired)]
    assert states == ["cancelled", "cancelled", "dispatched"]  # the job waiting for it too
    step = (await client.get(first.id)).history[-1]
    assert (step.event, step.detail) == ("cancelled", f"bulk action {started.id}: cancel")
    assert client.bulk_started == [started]
    assert client.cancelled == []  # one-by-one cancels only

    again = await client.bulk.start("cancel")
    assert again.touched == 0  # nothing left to cancel
    assert [action.id for action in await client.bulk.list()] == [again.id, started.id]
    assert [action.id for action in await client.bulk.list(limit=1, before=again.id)] == [
        started.id
    ]
    assert await client.bulk.get(started.id) == started
    for verb in (client.bulk.stop, client.bulk.resume):
        with pytest.raises(BulkActionConflict) as conflict:
            await verb(started.id)
        assert (conflict.value.status, conflict.value.body["state"]) == (409, "done")
    with pytest.raises(BulkActionNotFound):
        await client.bulk.get("00000000-0000-7000-8000-00000000ffff")


async def test_a_bulk_reschedule_moves_the_jobs_in_the_run_at_range(
    client: RecordingClient,
) -> None:
    soon = await client.schedule("reports.daily", {}, delay=60)
    later = await client.schedule("reports.daily", {}, delay=3600)
    window = {"run_at_from": NOW + timedelta(minutes=30), "run_at_to": NOW + timedelta(hours=2)}
    target = NOW + timedelta(days=1, microseconds=123456)
    moved = await client.bulk.start("reschedule", filter=window, run_at=target)
    assert (moved.touched, moved.run_at) == (1, target)
    assert [(await client.get(job.id)).run_at for job in (soon, later)] == [
        NOW + timedelta(seconds=60),
        target,
    ]
    step = (await client.get(later.id)).history[-1]
    assert (step.event, step.detail) == (
        "rescheduled",
        f"bulk action {moved.id}: reschedule to 2030-01-02T12:00:00.123Z",
    )
    shifted = await client.bulk.start("reschedule", shift=timedelta(minutes=-5))
    assert (shifted.touched, shifted.shift_s) == (2, -300.0)
    assert (await client.get(soon.id)).run_at == NOW + timedelta(seconds=-240)


async def test_a_bulk_requeue_takes_the_dead_jobs_whose_error_matches_in_any_case(
    client: RecordingClient,
) -> None:
    jobs = [await client.schedule("billing.charge", {"n": n}) for n in range(3)]
    client.mark(jobs[0].id, "dead", error="TimeoutError: upstream")
    client.mark(jobs[1].id, "dead", error="ValueError: bad card")
    dry = await client.bulk.dry_run(
        "requeue", filter={"error_contains": "TIMEOUT", "finished_from": NOW}
    )
    assert [job.id for job in dry.sample] == [jobs[0].id]
    requeued = await client.bulk.start("requeue", filter={"error_contains": "timeout"})
    assert requeued.touched == 1
    job = await client.get(jobs[0].id)
    assert (job.state, job.run_at, job.last_error) == ("scheduled", NOW, None)
    assert [(step.event, step.detail) for step in job.history] == [
        ("scheduled", None),
        ("dead", None),
        ("requeued", f"bulk action {requeued.id}: requeue"),
    ]
    assert (await client.get(jobs[1].id)).state == "dead"
    assert client.requeued == []


@pytest.mark.parametrize(
    ("action", "given", "field"),
    [
        ("cancel", {"filter": {"state": "dead"}}, "filter.state"),
        ("requeue", {"filter": {"state": "scheduled"}}, "filter.state"),
        ("cancel", {"filter": {"routing_key": "orders.*"}}, "filter.routing_key"),
        ("cancel", {"filter": {"routing_key_prefix": "a b"}}, "filter.routing_key_prefix"),
        (
            "cancel",
            {"filter": {"run_at_from": NOW, "run_at_to": NOW - timedelta(1)}},
            "filter.run_at_to",
        ),
        ("cancel", {"filter": {"finished_from": NOW}}, "filter.finished_from"),
        ("requeue", {"filter": {"error_contains": ""}}, "filter.error_contains"),
        ("requeue", {"filter": {"error_contains": "x" * 1001}}, "filter.error_contains"),
        ("cancel", {"filter": {"namespace": "no spaces"}}, "filter.namespace"),
        ("reschedule", {}, "run_at"),
        ("reschedule", {"run_at": NOW, "shift": 5}, "run_at"),
        ("reschedule", {"shift": 0}, "shift_s"),
        ("reschedule", {"run_at": NOW + timedelta(days=4000)}, "run_at"),
        ("cancel", {"shift": 60}, "shift_s"),
    ],
)
async def test_bad_bulk_requests_are_refused_naming_the_field(
    client: RecordingClient, action: Any, given: dict[str, Any], field: str
) -> None:
    await client.schedule("orders.expire", {})
    with pytest.raises(InvalidBulkAction) as refused:
        await client.bulk.dry_run(action, **given)
    assert [found["field"] for found in refused.value.body["fields"]] == [field]
    with pytest.raises(InvalidBulkAction):
        await client.bulk.start(action, **given)
    assert client.bulk_started == []
