import dataclasses
import json
import uuid
from datetime import UTC, datetime

import pytest

from consumers_sdk import contract
from consumers_sdk.ids import JobIds, shard_for


def test_job_ids_are_uuid7_and_strictly_increasing() -> None:
    generator = JobIds()
    ids = [generator.next() for _ in range(10_000)]
    assert all(job_id.version == 7 for job_id in ids)
    assert all(job_id.variant == uuid.RFC_4122 for job_id in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_job_ids_stay_ordered_when_the_counter_overflows_or_the_clock_stands_still() -> None:
    generator = JobIds(clock_ns=lambda: 1_700_000_000_000_000_000)
    ids = [generator.next() for _ in range(5000)]  # more than 4096 in one "millisecond"
    assert ids == sorted(ids)
    assert (ids[-1].int >> 80) == 1_700_000_000_000 + 1


def test_shard_choice_is_stable_and_within_the_given_shards() -> None:
    shards = [3, 9, 27]
    job_id = uuid.uuid4().bytes
    assert shard_for(job_id, shards) == shard_for(job_id, shards)
    assert {shard_for(uuid.uuid4().bytes, shards) for _ in range(200)} == set(shards)


def test_headers_carry_the_contract_and_the_users_headers() -> None:
    run_at = datetime(2026, 11, 22, 8, 0, 0, 123456, tzinfo=UTC)
    headers = contract.message_headers(
        job_id="j1", run_at=run_at, idempotency_key="k", user_headers={"tenant": "a"}
    )
    assert headers == {
        "tenant": "a",
        "x-job-id": "j1",
        "x-run-at": "2026-11-22T08:00:00.123Z",
        "x-idempotency-key": "k",
    }
    envelope = contract.read_envelope(message_id="j1", routing_key="rk", headers=headers)
    assert envelope.run_at == datetime(2026, 11, 22, 8, 0, 0, 123000, tzinfo=UTC)
    assert envelope.idempotency_key == "k"


def test_reserved_headers() -> None:
    assert contract.is_reserved_header("x-death")
    assert contract.is_reserved_header("X-Job-Id")
    assert not contract.is_reserved_header("x-trace-id")
    assert not contract.is_reserved_header("tenant")


@pytest.mark.parametrize(
    "name",
    [
        "x-dead-routing-key",
        "X-Dead-Queue",
        "x-delivery-count",
        "x-death",
        "x-first-death-queue",
        "x-last-death-reason",
        "x-received-from",
        "x-shovelled",
        "x-shovelled-timestamp",
        "x-stream-offset",
        "x-opt-partition-key",
        "x-dispatcher-round",
        "CC",
        "bcc",
    ],
)
def test_every_header_the_dispatcher_the_sdk_or_rabbitmq_reads_is_refused(name: str) -> None:
    assert contract.header_name_problem(name) == (
        f"header {name!r} is reserved for the dispatcher and RabbitMQ"
    )


@pytest.mark.parametrize("name", ["x-deadline", "x-deliveryman", "ccc", "recipients-cc", "h" * 128])
def test_names_that_merely_look_alike_are_a_producers_own(name: str) -> None:
    assert contract.header_name_problem(name) is None


def test_a_header_name_over_128_bytes_is_refused_as_amqp_would_cut_it() -> None:
    assert contract.header_name_problem("é" * 64) is None  # 128 bytes
    assert contract.header_name_problem("é" * 64 + "a") == (
        "header names must be at most 128 bytes (AMQP cuts longer ones)"
    )


def test_reserved_names_stored_in_a_row_are_never_published_but_the_retry_policy_is() -> None:
    stored: dict[str, contract.HeaderValue] = {
        "tenant": "a",
        "x-dead-routing-key": "payments.charge",
        "CC": "payments.charge",
        "x-dispatcher-round": "forged",
        "x-retry-max-attempts": 3,
        "x-retry-attempt": 9,
    }
    headers = contract.message_headers(
        job_id="j1",
        run_at=datetime(2026, 1, 1, tzinfo=UTC),
        idempotency_key=None,
        user_headers=stored,
    )
    assert {name: headers[name] for name in headers if name != "x-run-at"} == {
        "tenant": "a",
        "x-retry-max-attempts": 3,
        "x-job-id": "j1",
    }


def an_event(**fields: object) -> contract.JobEvent:
    event = contract.JobEvent(
        event_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        routing_key="orders.expire",
        group="billing",
        consumer="w1",
        attempt=2,
        outcome="failed",
        error="ValueError: a\x00b" + "x" * 2000,
        at=datetime(2026, 11, 22, 8, 0, 0, 123456, tzinfo=UTC),
    )
    return dataclasses.replace(event, **fields)  # type: ignore[arg-type]


def test_job_events_round_trip_and_decoding_makes_any_event_storable() -> None:
    event = an_event()
    decoded = contract.decode_event(contract.encode_event(event))
    assert decoded.at == event.at  # microseconds kept: the steps of one attempt stay in order
    assert decoded.error == ("ValueError: a\ufffdb" + "x" * 2000)[: contract.EVENT_ERROR_LIMIT]
    assert (decoded.job_id, decoded.attempt, decoded.outcome) == (event.job_id, 2, "failed")
    body = json.loads(contract.encode_event(event))
    for broken in (
        {**body, "outcome": "exploded"},
        {**body, "job_id": "order-1"},
        {**body, "attempt": 2**40},
        {**body, "at": "2026-11-22T08:00:00"},
        {key: value for key, value in body.items() if key != "event_id"},
    ):
        with pytest.raises(ValueError, match=r"event|outcome|attempt|offset"):
            contract.decode_event(json.dumps(broken).encode())
    with pytest.raises(ValueError, match="not a job event"):
        contract.decode_event(b"[1, 2]")


def test_a_message_of_events_holds_an_array_and_one_bad_event_refuses_it_whole() -> None:
    events = [an_event(outcome="started", error=None) for _ in range(3)]
    body = contract.encode_events(events)
    assert [event.event_id for event in contract.decode_events(body)] == [
        event.event_id for event in events
    ]
    # A message of one event, as SDKs before the arrays sent it, reads as a list of one.
    assert contract.decode_events(contract.encode_event(events[0])) == [
        contract.decode_event(contract.encode_event(events[0]))
    ]
    items = json.loads(body)
    for broken in (
        [*items[:2], {**items[2], "outcome": "exploded"}],
        [*items, 7],
        [],
        [items[0]] * (contract.EVENTS_PER_MESSAGE + 1),
    ):
        with pytest.raises(ValueError, match=r"event|outcome|per message"):
            contract.decode_events(json.dumps(broken).encode())
    for too_many in ([], events[:1] * (contract.EVENTS_PER_MESSAGE + 1)):
        with pytest.raises(ValueError, match="per message"):
            contract.encode_events(too_many)
    with pytest.raises(ValueError, match="not a job event"):
        contract.decode_events(b"{not json")


def test_an_event_message_nested_past_any_depth_is_refused_as_not_events() -> None:
    # A RecursionError here would escape the dispatcher's events loop with the message unacked.
    for body in (b"[" * 100_000, b'{"a":' * 100_000):
        with pytest.raises(ValueError, match="not a job event"):
            contract.decode_events(body)
        with pytest.raises(ValueError, match="not a job event"):
            contract.decode_event(body)


def test_an_event_carries_the_round_of_its_delivery_and_an_older_sdks_event_has_none() -> None:
    dispatch_round = str(uuid.uuid4())
    headers = contract.message_headers(
        job_id="j1",
        run_at=datetime(2026, 1, 1, tzinfo=UTC),
        idempotency_key=None,
        user_headers={},
        dispatch_round=dispatch_round,
    )
    envelope = contract.read_envelope(message_id="j1", routing_key="rk", headers=headers)
    assert envelope.dispatch_round == headers[contract.HEADER_ROUND] == dispatch_round
    event = an_event(outcome="succeeded", error=None, dispatch_round=envelope.dispatch_round)
    body = json.loads(contract.encode_event(event))
    assert body["round"] == dispatch_round
    assert contract.decode_event(contract.encode_event(event)).dispatch_round == dispatch_round
    del body["round"]  # as an SDK older than rounds sends it
    assert contract.decode_event(json.dumps(body).encode()).dispatch_round is None
    with pytest.raises(ValueError, match="not a job event"):
        contract.decode_event(json.dumps({**body, "round": "guess"}).encode())


def test_an_events_ids_are_read_in_any_spelling_of_a_uuid_and_kept_in_the_canonical_one() -> None:
    event = an_event(dispatch_round=str(uuid.uuid4()))
    body = json.loads(contract.encode_event(event))
    spelled = {
        **body,
        "event_id": body["event_id"].upper(),
        "job_id": "{" + body["job_id"] + "}",
        "round": body["round"].replace("-", ""),
    }
    decoded = contract.decode_event(json.dumps(spelled).encode())
    assert (decoded.event_id, decoded.job_id, decoded.dispatch_round) == (
        event.event_id,
        event.job_id,
        event.dispatch_round,
    )
    for bad in ("g" * 32, body["job_id"] + "0", 7, None, ["x"]):
        with pytest.raises(ValueError, match="not a job event"):
            contract.decode_event(json.dumps({**body, "job_id": bad}).encode())
