import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pydantic import ValidationError

from consumers_sdk.ids import JobIds
from dispatcher import errors, models
from dispatcher.api.problems import field_name
from dispatcher.api.schemas import (
    JobBatchCreate,
    JobCreate,
    JobOut,
    JobSubmitted,
    history_document,
    job_document,
    json_response,
    to_spec,
)
from dispatcher.models import Job, JobEvent, JobState
from dispatcher.settings import Settings

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def settings(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]


def invalid_fields(data: object) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        JobCreate.model_validate(data)
    return [field_name(error["loc"]) for error in caught.value.errors()]


def test_minimal_job_is_due_now() -> None:
    spec = to_spec(JobCreate(routing_key="a.b", payload=None), settings(), now=NOW)
    assert spec.run_at == NOW
    assert spec.payload == b"null"


def test_delay_sets_run_at() -> None:
    job = JobCreate.model_validate({"routing_key": "a", "payload": 1, "delay_ms": 1500})
    assert to_spec(job, settings(), now=NOW).run_at == NOW + timedelta(milliseconds=1500)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"payload": 1}, "routing_key"),
        ({"routing_key": "a"}, "payload"),
        ({"routing_key": "a", "payload": 1, "extra": 1}, "extra"),
        ({"routing_key": "a.*", "payload": 1}, "routing_key"),
        ({"routing_key": "a..b", "payload": 1}, "routing_key"),
        ({"routing_key": "x" * 256, "payload": 1}, "routing_key"),
        ({"routing_key": "a", "payload": 1, "delay_ms": -1}, "delay_ms"),
        ({"routing_key": "a", "payload": 1, "delay_ms": "5"}, "delay_ms"),
        ({"routing_key": "a", "payload": 1, "run_at": "2026-01-01T00:00:00"}, "run_at"),
        (
            {"routing_key": "a", "payload": 1, "delay_ms": 1, "run_at": "2026-01-01T00:00:00Z"},
            "run_at",
        ),
        ({"routing_key": "a", "payload": 1, "priority": 10}, "priority"),
        ({"routing_key": "a", "payload": 1, "ttl_ms": 0}, "ttl_ms"),
        ({"routing_key": "a", "payload": 1, "idempotency_key": ""}, "idempotency_key"),
        ({"routing_key": "a", "payload": 1, "headers": {"x-job-id": "1"}}, "headers"),
        ({"routing_key": "a", "payload": 1, "headers": {"h": [1]}}, "headers.h"),
    ],
)
def test_invalid_job_names_the_field(data: dict[str, object], field: str) -> None:
    assert any(name.startswith(field) for name in invalid_fields(data))


def test_batch_errors_name_the_index() -> None:
    with pytest.raises(ValidationError) as caught:
        JobBatchCreate.model_validate(
            {"jobs": [{"routing_key": "a", "payload": 1}, {"routing_key": "b", "priority": 1}]}
        )
    assert [field_name(e["loc"]) for e in caught.value.errors()] == ["jobs[1].payload"]


def test_payload_over_limit_is_refused_with_its_field() -> None:
    job = JobCreate(routing_key="a", payload="x" * 100)
    with pytest.raises(errors.PayloadTooLarge) as caught:
        to_spec(job, settings(max_payload_bytes=50), now=NOW, field_prefix="jobs[2].")
    assert caught.value.field == "jobs[2].payload"


@pytest.mark.parametrize(
    ("job", "limits", "field"),
    [
        ({"headers": {f"h{i}": i for i in range(5)}}, {"max_headers": 4}, "headers"),
        ({"headers": {"h": "v" * 100}}, {"max_header_bytes": 50}, "headers.h"),
        ({"delay_ms": 10 * 86_400_000}, {"max_delay_days": 5}, "delay_ms"),
        ({"run_at": "2999-01-01T00:00:00Z"}, {}, "run_at"),
        ({"idempotency_key": "k" * 20}, {"max_idempotency_key_length": 10}, "idempotency_key"),
    ],
)
def test_configured_limits_name_the_field(
    job: dict[str, object], limits: dict[str, object], field: str
) -> None:
    request = JobCreate.model_validate({"routing_key": "a", "payload": 1, **job})
    with pytest.raises(errors.InvalidField) as caught:
        to_spec(request, settings(**limits), now=NOW)
    assert caught.value.field == field


def stored(**changes: object) -> Job:
    job = Job(
        id=JobIds().next(),
        shard=3,
        state=JobState.SCHEDULED,
        routing_key="orders.expire",
        payload=b'{"order": 123, "items": [1, 2]}',
        run_at=NOW,
        idempotency_key="k",
        headers={"tenant": "acme", "n": 1},
        priority=4,
        ttl_ms=500,
        created_at=NOW,
        updated_at=NOW,
        dispatched_at=None,
        publish_attempts=0,
    )
    return dataclasses.replace(job, **changes)  # type: ignore[arg-type]


def test_rendered_job_has_exactly_the_documented_shape() -> None:
    job = stored()
    document = job_document(job, outcome=models.Outcome.CREATED)
    body = json_response(document, 201).body
    parsed = JobSubmitted.model_validate_json(body)
    assert set(document) == set(JobSubmitted.model_fields)
    assert parsed.id == job.id
    assert parsed.payload == {"order": 123, "items": [1, 2]}
    assert parsed.run_at == NOW
    assert orjson.loads(body)["run_at"] == "2026-01-01T00:00:00Z"
    assert parsed.created is True
    assert parsed.outcome is models.Outcome.CREATED


INT64 = st.integers(-(2**63), 2**63 - 1)
MOMENTS = st.datetimes(timezones=st.just(UTC))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
JOBS = st.builds(
    Job,
    id=st.uuids(),
    shard=st.integers(0, 2**31 - 1),
    state=st.sampled_from(JobState),
    routing_key=st.text(min_size=1),
    payload=JSON_VALUES.map(orjson.dumps),
    run_at=MOMENTS,
    idempotency_key=st.none() | st.text(),
    headers=st.dictionaries(
        st.text(), st.text() | st.booleans() | INT64 | st.floats(allow_nan=False), max_size=4
    ),
    priority=st.none() | st.integers(0, 9),
    ttl_ms=st.none() | st.integers(1, 2**63 - 1),
    created_at=MOMENTS,
    updated_at=MOMENTS,
    dispatched_at=st.none() | MOMENTS,
    publish_attempts=st.integers(0, 2**31 - 1),
    namespace=st.none() | st.text(),
    last_error=st.none() | st.text(),
    release_key=st.sampled_from(models.KeyRelease),
    key_released=st.booleans(),
)


@hypothesis_settings(deadline=None)  # the machine's load, not the renderer, sets the pace
@given(JOBS, st.none() | st.sampled_from(models.Outcome))
def test_the_hand_renderer_answers_what_the_response_model_would(
    job: Job, outcome: models.Outcome | None
) -> None:
    """``job_document`` (a second path, for speed) against pydantic rendering ``JobOut`` (or
    ``JobSubmitted``, with the outcome) from the same job: the same JSON, field for field."""
    fields = {**dataclasses.asdict(job), "payload": orjson.loads(job.payload)}
    model = (
        JobOut(**fields)
        if outcome is None
        else JobSubmitted(**fields, created=outcome is models.Outcome.CREATED, outcome=outcome)
    )
    by_hand = json_response(job_document(job, outcome=outcome)).body
    assert orjson.loads(by_hand) == orjson.loads(model.model_dump_json())


def test_run_at_with_an_offset_is_stored_in_utc() -> None:
    offset = datetime(2026, 1, 1, 8, tzinfo=timezone(timedelta(hours=8)))
    spec = to_spec(JobCreate(routing_key="a.b", payload=1, run_at=offset), settings(), now=NOW)
    assert spec.run_at == offset
    assert spec.run_at.tzinfo == UTC


def test_history_places_each_dispatch_after_the_step_it_follows_whatever_its_time() -> None:
    def at(seconds: int) -> datetime:
        return NOW + timedelta(seconds=seconds)

    def event(outcome: str, seconds: int, attempt: int = 1) -> JobEvent:
        group = "dispatcher" if outcome in ("requeued", "dispatched") else "billing"
        return JobEvent(
            outcome=outcome, attempt=attempt, group=group, consumer="w", error=None, at=at(seconds)
        )

    # Marked dispatched after the consumer had already started.
    job = stored(state=JobState.SUCCEEDED, updated_at=at(9), dispatched_at=at(7))
    events = [
        event("started", 1),
        event("dispatched", 2),  # the first dispatch, kept by the requeue
        event("dead", 3),
        event("requeued", 5),
        event("started", 6),
        event("succeeded", 8),
    ]
    steps = [step["event"] for step in history_document(job, events)["history"]]
    assert steps == [
        "scheduled",
        "dispatched",
        "started",
        "dead",
        "requeued",
        "dispatched",
        "started",
        "succeeded",
    ]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        # Accepted once, these stopped every node that claimed them (issue found by a user).
        ({"ttl_ms": 1_000_000_000_000_000}, "ttl_ms"),
        ({"ttl_ms": 2**32}, "ttl_ms"),  # past RabbitMQ's longest message expiration
        ({"headers": {"h" * 129: 1}}, "headers." + "h" * 129),  # AMQP would cut it to 128 bytes
        ({"headers": {"é" * 65: 1}}, "headers." + "é" * 65),  # 130 bytes in 65 characters
        ({"headers": {"x-dead-routing-key": "payments.charge"}}, "headers.x-dead-routing-key"),
        ({"headers": {"X-Delivery-Count": 1}}, "headers.X-Delivery-Count"),
    ],
)
def test_values_the_pipeline_cannot_carry_are_refused_by_field(
    data: dict[str, object], field: str
) -> None:
    assert invalid_fields({"routing_key": "a.b", "payload": 1, **data}) == [field]


def test_a_due_time_past_the_limit_or_before_the_epoch_is_refused() -> None:
    limit = timedelta(days=Settings().max_delay_days)
    for due in (datetime(1969, 12, 31, 23, 59, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)):
        job = JobCreate.model_validate({"routing_key": "a.b", "payload": 1, "run_at": due})
        with pytest.raises(errors.InvalidField) as caught:
            to_spec(job, settings(), now=NOW)
        assert caught.value.field == "run_at"
    far = JobCreate(routing_key="a.b", payload=1, delay_ms=int((limit / 1e-3).total_seconds()) + 1)
    with pytest.raises(errors.InvalidField) as caught:
        to_spec(far, settings(), now=NOW)
    assert caught.value.field == "delay_ms"


def test_the_extremes_inside_the_bounds_are_accepted() -> None:
    limit = timedelta(days=Settings().max_delay_days)
    for due in (datetime(1970, 1, 1, tzinfo=UTC), NOW + limit):
        job = JobCreate.model_validate(
            {
                "routing_key": "a.b",
                "payload": 1,
                "run_at": due,
                "ttl_ms": 2**32 - 1,
                "headers": {"h" * 128: "v"},
            }
        )
        assert to_spec(job, settings(), now=NOW).run_at == due
