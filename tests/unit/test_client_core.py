"""The client's pure core: the requests it builds, the answers it parses (rendered by the
dispatcher's own code), the errors it maps, the retry and replay rules, and the chunks of
schedule_many. No I/O."""

from __future__ import annotations

import dataclasses
import inspect
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from consumers_sdk import (
    AccessDenied,
    ClientError,
    DispatcherClient,
    DispatcherUnavailable,
    InvalidJob,
    InvalidSchedule,
    JobConflict,
    JobNotFound,
    JobRecord,
    ScheduleConflict,
    ScheduleNotFound,
    SyncDispatcherClient,
    calls,
    exchange,
    records,
    validation,
)
from consumers_sdk.client import BulkActions, Limits, Schedules
from consumers_sdk.sync_client import SyncBulkActions, SyncLimits, SyncSchedules
from dispatcher import models
from dispatcher.api import schemas
from tests.support import answers

RUN_AT = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "durations",
    [
        {"delay": 1.5, "ttl": 60, "retry_backoff": [2, 0.5]},
        {
            "delay": timedelta(seconds=1.5),
            "ttl": timedelta(minutes=1),
            "retry_backoff": [timedelta(seconds=2), timedelta(milliseconds=500)],
        },
    ],
)
def test_every_job_duration_takes_a_timedelta_or_seconds(durations: dict[str, Any]) -> None:
    assert calls.job_body("a.b", {"x": 1}, **durations) == {
        "routing_key": "a.b",
        "payload": {"x": 1},
        "delay_ms": 1500,
        "ttl_ms": 60_000,
        "retry_backoff_s": [2.0, 0.5],
    }


def test_a_bad_duration_or_time_is_refused_naming_the_argument() -> None:
    assert calls.job_body("a", 1, delay=-3)["delay_ms"] == 0  # a delay already past: due now
    with pytest.raises(TypeError, match="delay"):
        calls.job_body("a", 1, delay=True)
    with pytest.raises(TypeError, match="ttl"):
        calls.job_body("a", 1, ttl="60")  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="ttl must be finite"):
        calls.job_body("a", 1, ttl=float("nan"))
    with pytest.raises(ValueError, match="not both"):
        calls.job_body("a", 1, delay=1, run_at=RUN_AT)
    with pytest.raises(ValueError, match="run_at must be timezone-aware"):
        calls.job_body("a", 1, run_at=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="interval must be whole seconds"):
        calls.create_schedule("s", "a", 1, interval=1.5)
    with pytest.raises(ValueError, match="give"):
        calls.reschedule("j")
    with pytest.raises(ValueError, match="give"):
        calls.change_schedule("s")


def test_each_job_call_names_its_route_and_whether_a_replay_is_harmless() -> None:
    found = [
        (call.method, call.path, call.replay_safe)
        for call in (
            calls.schedule("a", 1),
            calls.schedule("a", 1, idempotency_key="k"),
            calls.schedule_batch([calls.job_body("a", 1, idempotency_key="k")]),
            calls.schedule_batch(
                [calls.job_body("a", 1, idempotency_key="k"), {"routing_key": "a"}]
            ),
            calls.get("01890000-0000-7000-8000-000000000001"),
            calls.reschedule("j", run_at=RUN_AT),
            calls.reschedule("j", delay=60),
            calls.cancel("j"),
            calls.requeue("j/../x"),
        )
    ]
    assert found == [
        ("POST", "/v1/jobs", False),
        ("POST", "/v1/jobs", True),
        ("POST", "/v1/jobs/batch", True),
        ("POST", "/v1/jobs/batch", False),
        ("GET", "/v1/jobs/01890000-0000-7000-8000-000000000001", True),
        ("PATCH", "/v1/jobs/j", True),
        ("PATCH", "/v1/jobs/j", False),  # a replayed delay would count again from the replay
        ("DELETE", "/v1/jobs/j", False),
        ("POST", "/v1/jobs/j%2F..%2Fx/requeue", False),  # an id never reaches another path
    ]
    assert calls.reschedule("j", priority=None, payload=[1]).json == {
        "priority": None,
        "payload": [1],
    }
    page = calls.page(state="dead", routing_key="a.b", after="j", limit=10)
    assert dict(page.params) == {"state": "dead", "routing_key": "a.b", "after": "j", "limit": 10}
    assert dict(calls.page().params) == {"limit": 100}


def test_each_schedule_call_sends_the_fields_the_api_names() -> None:
    create = calls.create_schedule(
        "nightly",
        "reports.nightly",
        {"r": 1},
        interval=timedelta(hours=1),
        grace=30,
        ttl=5,
        headers={"tenant": "acme"},
        start_at=RUN_AT,
        missed="skip",
    )
    assert (create.method, create.path, create.subject, create.replay_safe) == (
        "POST",
        "/v1/schedules",
        "schedule",
        False,
    )
    assert create.json == {
        "name": "nightly",
        "job": {
            "routing_key": "reports.nightly",
            "payload": {"r": 1},
            "headers": {"tenant": "acme"},
            "priority": None,
            "ttl_ms": 5000,
        },
        "interval_s": 3600,
        "grace_s": 30.0,
        "missed": "skip",
        "start_at": RUN_AT.isoformat(),
    }
    change = calls.change_schedule("a b", end_at=None, paused=True)
    assert (change.method, change.path, change.json) == (
        "PATCH",
        "/v1/schedules/a%20b",
        {"end_at": None, "paused": True},  # a null end_at is sent: it removes the end
    )
    assert calls.delete_schedule("x").method == "DELETE"
    assert dict(calls.schedule_page(after=12, limit=5).params) == {"after": 12, "limit": 5}


def test_a_job_answer_becomes_a_record_with_its_history_and_unknown_keys_ignored() -> None:
    events = [
        models.JobEvent(
            outcome="failed",
            attempt=1,
            group="billing",
            consumer="w1",
            error="boom",
            at=answers.CREATED_AT + timedelta(minutes=31),
        )
    ]
    response = answers.history_answer(events)
    document = {**response.json(), "a_later_field": {"x": 1}}
    job = records.job(document)
    assert job.id == "01890000-0000-7000-8000-000000000001"
    assert (job.payload, job.headers, job.priority, job.ttl_ms) == (
        {"order": 7},
        {"tenant": "acme"},
        4,
        60_000,
    )
    assert job.run_at == answers.CREATED_AT + timedelta(minutes=30)
    assert job.run_at.tzinfo is not None
    assert [(step.event, step.attempt, step.error) for step in job.history] == [
        ("scheduled", None, None),
        ("failed", 1, "boom"),
    ]
    assert job.created is None
    with pytest.raises(AttributeError):
        job.state = "dead"  # type: ignore[misc]


def test_a_schedule_answer_becomes_a_record() -> None:
    upcoming = [answers.CREATED_AT + timedelta(days=day) for day in range(1, 3)]
    schedule = records.schedule(answers.schedule_answer(upcoming).json())
    assert (schedule.name, schedule.cron, schedule.timezone, schedule.interval_s) == (
        "nightly",
        "30 2 * * *",
        "Europe/Paris",
        None,
    )
    assert schedule.job == records.JobTemplate(
        routing_key="reports.nightly", payload=[1, 2], headers={}, priority=None, ttl_ms=None
    )
    assert schedule.upcoming == tuple(upcoming)
    assert schedule.missed == "latest"


def test_reading_a_record_by_key_still_works_with_a_deprecation_warning() -> None:
    job = records.job(answers.job_answer().json())
    with pytest.warns(DeprecationWarning, match=r"use job\.id"):
        assert job["id"] == job.id
    with pytest.warns(DeprecationWarning, match="nothing"), pytest.raises(KeyError):
        _ = job["nothing"]


@pytest.mark.parametrize(
    ("status", "subject", "kind"),
    [
        (401, "job", AccessDenied),
        (403, "schedule", AccessDenied),
        (422, "job", InvalidJob),
        (413, "job", InvalidJob),
        (422, "schedule", InvalidSchedule),
        (404, "job", JobNotFound),
        (404, "schedule", ScheduleNotFound),
        (409, "job", JobConflict),
        (409, "schedule", ScheduleConflict),
        (503, "job", DispatcherUnavailable),
        (429, "job", ClientError),
    ],
)
def test_each_refusal_maps_to_its_typed_error(
    status: int, subject: calls.Subject, kind: type[ClientError]
) -> None:
    refused = exchange.error(answers.problem(status, "e", "why", state="dead"), subject)
    assert type(refused) is kind
    assert (refused.status, refused.message, refused.body["state"]) == (status, "why", "dead")


def test_an_answer_that_is_not_json_still_maps_to_an_error() -> None:
    refused = exchange.error(httpx.Response(502, text="<html>bad gateway</html>"))
    assert (type(refused), refused.status, refused.message) == (
        ClientError,
        502,
        "<html>bad gateway</html>",
    )
    with pytest.raises(ClientError, match="unexpected answer"):
        exchange.parsed(calls.get("j"), httpx.Response(200, json={"id": "j"}))


def run(
    call: calls.Call[Any], outcomes: list[exchange.Outcome], retries: int = 3
) -> tuple[Any, list[float]]:
    """Drive ``exchange.attempts`` as a client does: its result, and the waits it asked for."""
    steps = exchange.attempts(call, retries=retries, rng=random.Random(7))
    waits: list[float] = []
    step = next(steps)
    for outcome in outcomes:
        assert not isinstance(step, exchange.Done)
        waits.append(step)
        step = steps.send(outcome)
        if isinstance(step, exchange.Done):
            return step.value, waits
    raise AssertionError("asked for more sends than given")


def lost() -> httpx.ReadTimeout:
    return httpx.ReadTimeout("sent, but no answer")


def test_503_and_unsent_requests_are_retried_with_growing_jittered_waits() -> None:
    unavailable = answers.problem(503, "unavailable", "later")
    refused = httpx.ConnectError("refused")
    job, waits = run(
        calls.schedule("a", 1), [unavailable, refused, unavailable, answers.job_answer(201)]
    )
    assert isinstance(job, JobRecord)
    assert job.created is True
    assert waits[0] == 0
    for wait, pause in zip(waits[1:], (0.2, 0.4, 0.8), strict=True):
        assert pause <= wait <= 2 * pause


def test_a_429_is_sent_again_no_sooner_than_its_retry_after() -> None:
    busy = answers.problem(429, "busy", "retry")
    busy.headers["retry-after"] = "3"
    undated = answers.problem(429, "busy", "retry")
    job, waits = run(calls.get("j"), [busy, undated, answers.job_answer()])
    assert isinstance(job, JobRecord)
    assert waits[1] == 3.0
    assert 0.4 <= waits[2] <= 0.8  # without one: the backoff
    with pytest.raises(ClientError) as refused:
        run(calls.get("j"), [busy] * 2, retries=1)
    assert refused.value.status == 429


def test_a_lost_answer_is_replayed_only_when_replaying_is_harmless() -> None:
    with pytest.raises(DispatcherUnavailable, match="no answer"):
        run(calls.schedule("a", 1), [lost()])  # a replay could store the job twice
    with pytest.raises(DispatcherUnavailable):
        run(calls.cancel("j"), [lost()])
    job, waits = run(calls.schedule("a", 1, idempotency_key="k"), [lost(), answers.job_answer()])
    assert job.created is False
    assert len(waits) == 2
    assert run(calls.get("j"), [lost(), lost(), answers.job_answer()])[0].id == job.id


def test_the_last_retry_reports_what_went_wrong() -> None:
    with pytest.raises(DispatcherUnavailable) as unavailable:
        run(calls.get("j"), [answers.problem(503, "unavailable", "later")] * 2, retries=1)
    assert unavailable.value.status == 503
    with pytest.raises(DispatcherUnavailable) as unreachable:
        run(calls.get("j"), [httpx.ConnectError("refused")] * 2, retries=1)
    assert unreachable.value.status == 0
    with pytest.raises(JobNotFound):  # a 4xx is not retried
        run(calls.get("j"), [answers.problem(404, "not_found", "no job")])


def test_schedule_many_is_cut_in_chunks_of_the_given_size() -> None:
    assert [(offset, list(chunk)) for offset, chunk in exchange.chunks(list(range(7)), 3)] == [
        (0, [0, 1, 2]),
        (3, [3, 4, 5]),
        (6, [6]),
    ]
    with pytest.raises(ValueError, match="chunk_size"):
        list(exchange.chunks([1], 0))


def test_a_failed_chunk_says_what_the_chunks_before_it_stored() -> None:
    stored = [records.job(answers.job_answer().json())] * 3
    refused = InvalidJob(
        422,
        "jobs[1].routing_key: bad",
        {"fields": [{"field": "jobs[1].routing_key", "message": "bad"}]},
    )
    error = exchange.partly_stored(refused, stored, 3)
    assert type(error) is InvalidJob
    assert error.stored == tuple(stored)
    assert error.body["fields"] == [{"field": "jobs[4].routing_key", "message": "bad"}]
    assert "the 3 jobs before it were stored" in str(error)
    assert exchange.partly_stored(refused, [], 0) is refused


JOB_METHODS = "schedule schedule_many get list_page list reschedule cancel requeue job close"
SCHEDULE_METHODS = "create get list_page list change pause resume delete"
LIMIT_METHODS = "list get set pause resume delete"
BULK_METHODS = "dry_run start get list stop resume"


@pytest.mark.parametrize(
    ("async_class", "sync_class", "names"),
    [
        (DispatcherClient, SyncDispatcherClient, JOB_METHODS),
        (Schedules, SyncSchedules, SCHEDULE_METHODS),
        (Limits, SyncLimits, LIMIT_METHODS),
        (BulkActions, SyncBulkActions, BULK_METHODS),
    ],
)
def test_the_sync_client_offers_the_async_clients_methods_and_parameters(
    async_class: type, sync_class: type, names: str
) -> None:
    def methods(cls: type) -> dict[str, list[tuple[str, Any, Any]]]:
        return {
            name: [
                (parameter.name, parameter.kind, parameter.default)
                for parameter in inspect.signature(member).parameters.values()
            ]
            for name, member in vars(cls).items()
            if callable(member) and not name.startswith("_")
        }

    assert sorted(methods(async_class)) == sorted(names.split())
    assert methods(sync_class) == methods(async_class)


def test_the_key_levers_are_sent_only_when_not_the_default() -> None:
    assert "on_existing" not in calls.job_body("a", 1, idempotency_key="k", on_existing="keep")
    assert "release_key" not in calls.job_body("a", 1, idempotency_key="k", release_key="never")
    body = calls.job_body("a", 1, idempotency_key="k", on_existing="extend", release_key="finished")
    assert (body["on_existing"], body["release_key"]) == ("extend", "finished")
    # The node, not the client, refuses a lever without a key (InvalidJob naming the field).
    assert calls.job_body("a", 1, on_existing="replace")["on_existing"] == "replace"


@pytest.mark.parametrize(
    ("options", "replay_safe"),
    [
        ({"on_existing": "keep", "delay": 60}, True),  # the replay finds the job, unchanged
        ({"on_existing": "replace", "run_at": RUN_AT}, True),  # the same values again
        ({"on_existing": "extend", "run_at": RUN_AT}, True),
        ({"on_existing": "replace"}, True),  # due now either way
        ({"on_existing": "replace", "delay": 60}, False),  # the delay would count again
        ({"on_existing": "extend", "delay": 60}, False),
        ({"release_key": "dispatched", "run_at": RUN_AT}, False),  # may be a new job by then
        ({"release_key": "finished"}, False),
    ],
)
def test_a_lever_is_replayed_after_a_lost_answer_only_when_the_replay_does_what_once_did(
    options: dict[str, Any], replay_safe: bool
) -> None:
    assert calls.schedule("a", 1, idempotency_key="k", **options).replay_safe is replay_safe
    body = calls.job_body("a", 1, idempotency_key="k", **options)
    kept = calls.job_body("a", 2, idempotency_key="k2")
    assert calls.schedule_batch([kept, body]).replay_safe is replay_safe


def test_a_submit_answer_carries_its_outcome_and_the_key_release() -> None:
    document = schemas.job_document(
        answers.stored_job(release_key=models.KeyRelease.DISPATCHED, key_released=True),
        outcome=models.Outcome.EXTENDED,
    )
    job = records.job(answers.answer(document).json())
    assert (job.created, job.outcome, job.release_key, job.key_released) == (
        False,
        "extended",
        "dispatched",
        True,
    )
    plain = records.job(answers.answer(schemas.job_document(answers.stored_job())).json())
    assert (plain.outcome, plain.release_key, plain.key_released) == (None, "never", False)


@pytest.mark.parametrize(("created", "outcome"), [(True, "created"), (False, "kept")])
def test_an_older_dispatchers_answer_reads_its_outcome_from_created(
    created: bool, outcome: str
) -> None:
    """A dispatcher before the levers sent ``created`` alone; it could only keep a known key."""
    document = answers.job_answer().json()
    for newer in ("outcome", "release_key", "key_released"):
        del document[newer]
    job = records.job({**document, "created": created})
    assert (job.outcome, job.release_key, job.key_released) == (outcome, "never", False)


def test_a_change_by_the_dispatcher_is_a_history_step_with_its_detail() -> None:
    at = answers.CREATED_AT + timedelta(minutes=5)
    change = models.JobEvent(
        outcome="extended",
        attempt=0,
        group="dispatcher",
        consumer="node-1",
        error=None,
        at=at,
        detail="run_at 2030-01-01T13:00:00.000000Z",
    )
    job = records.job(answers.history_answer([change]).json())
    assert [(step.event, step.detail) for step in job.history] == [
        ("scheduled", None),
        ("extended", "run_at 2030-01-01T13:00:00.000000Z"),
    ]


def test_the_sdks_key_levers_are_the_nodes() -> None:
    """``validation``'s values (what enqueue and the memory API check) against the node's enums,
    the default first."""
    assert tuple(models.OnExisting) == validation.ON_EXISTING
    assert tuple(models.KeyRelease) == validation.KEY_RELEASES
    defaults = {field.name: field.default for field in dataclasses.fields(models.JobSpec)}
    assert (defaults["on_existing"], defaults["release_key"]) == (
        validation.ON_EXISTING[0],
        validation.KEY_RELEASES[0],
    )
