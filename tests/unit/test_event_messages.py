"""The SDK's events messages: the user_id it sends (the user it logs in as) and events packed
within the bound the dispatcher reads, each body the one encoding of its events."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from consumers_sdk import broker_urls, contract


def test_the_sdk_names_the_user_it_logs_in_as() -> None:
    assert broker_urls.login_user("amqp://billing-consumer:pw@mq:5672/jobs") == "billing-consumer"
    assert broker_urls.login_user("amqp://bill%40ing:pw@mq/") == "bill@ing"
    assert broker_urls.login_user("amqp://mq:5672/") == "guest"  # aiormq's default login
    assert broker_urls.login_user("amqps://mq/?auth=external&cafile=ca.pem") is None


def event(n: int, error: str | None = None) -> contract.JobEvent:
    return contract.JobEvent(
        event_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        routing_key="billing.charge",
        group="billing",
        consumer="worker-1",
        attempt=n,
        outcome="failed",
        error=error,
        at=datetime.now(UTC),
        dispatch_round=str(uuid.uuid4()),
    )


def test_packed_events_are_encode_events_in_order_within_the_bound() -> None:
    reported = [event(n, "E" * 900) for n in range(300)]
    packed = contract.pack_events(reported)
    assert len(packed) > 1
    assert [e for chunk, _ in packed for e in chunk] == reported
    for chunk, body in packed:
        assert body == contract.encode_events(chunk)  # the one encoding, pinned
        assert len(body) <= contract.EVENTS_MESSAGE_BYTES
        assert contract.decode_events(body) == chunk
    # Full: one more event would not have fitted.
    first_chunk, first_body = packed[0]
    following = contract.encode_event(packed[1][0][0])
    assert len(first_body) + 1 + len(following) > contract.EVENTS_MESSAGE_BYTES
    assert first_chunk


def test_packing_stops_at_the_events_a_message_may_hold_and_keeps_a_huge_event_alone() -> None:
    many = [event(n) for n in range(contract.EVENTS_PER_MESSAGE + 1)]
    assert [len(chunk) for chunk, _ in contract.pack_events(many, max_bytes=10**9)] == [
        contract.EVENTS_PER_MESSAGE,
        1,
    ]
    huge = [event(1), event(2, "x" * 500), event(3)]
    sizes = [len(chunk) for chunk, _ in contract.pack_events(huge, max_bytes=400)]
    assert sizes == [1, 1, 1]
    assert contract.pack_events([]) == []
