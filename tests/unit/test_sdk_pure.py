"""The SDK's pure parts: queue names and arguments, attempt counting, the copies it publishes,
the producer client's request bodies, and the checks made before anything connects."""

from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pytest
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from consumers_sdk import Consumer, topology
from consumers_sdk import job as job_mod
from consumers_sdk.client import job_body
from consumers_sdk.dedup import MemoryDeduplicator
from consumers_sdk.dlq import work_queue_of
from consumers_sdk.errors import DlqError

WORK = "billing.orders.expire"


def delivery(routing_key: str, headers: dict[str, Any], body: bytes = b'{"order":1}') -> Any:
    """An incoming message as aio-pika builds it from the wire, without a broker."""
    properties = aio_pika.Message(
        body,
        headers=headers,
        message_id="job-1",
        content_type="application/json",
        priority=4,
        expiration=5,
        correlation_id="c-1",
    ).properties
    return aio_pika.IncomingMessage(
        DeliveredMessage(
            delivery=Basic.Deliver(
                consumer_tag="t", delivery_tag=1, exchange="", routing_key=routing_key
            ),
            header=ContentHeader(body_size=len(body), properties=properties),
            body=body,
            channel=None,  # type: ignore[arg-type]
        )
    )


def test_queue_names_and_arguments() -> None:
    work = topology.work_queue("billing", "orders.expire")
    assert work == WORK
    assert topology.wait_queue(work, 0.25) == "billing.orders.expire.retry.250ms"
    assert topology.wait_queue(work, 60) == "billing.orders.expire.retry.60s"
    assert topology.dead_queue(work) == "billing.orders.expire.dead"
    quorum = topology.wait_arguments(work, 1.5, "quorum")
    assert quorum == {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-message-ttl": 1500,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": work,
        "x-delivery-limit": topology.POISON_DELIVERY_LIMIT,
    }
    assert topology.wait_arguments(work, 1.5, "classic") == {
        "x-message-ttl": 1500,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": work,
    }
    assert topology.work_arguments(work, "quorum")["x-dead-letter-routing-key"] == f"{work}.dead"
    assert "x-delivery-limit" not in topology.work_arguments(work, "classic")


def test_every_quorum_queue_states_its_delivery_limit_for_the_broker_it_runs_on() -> None:
    # 4.x drops past a default of 20 unless told -1; 3.x has no default and reads -1 as "drop".
    assert topology.dead_arguments("quorum", 4) == {
        "x-queue-type": "quorum",
        "x-delivery-limit": -1,
    }
    assert topology.dead_arguments("quorum", 3) == {"x-queue-type": "quorum"}
    assert topology.dead_arguments("classic", 4) == {}
    events = topology.events_arguments()
    assert events["x-delivery-limit"] == topology.POISON_DELIVERY_LIMIT
    assert events["x-dead-letter-routing-key"] == topology.EVENTS_DEAD_QUEUE
    assert events["x-dead-letter-strategy"] == "at-least-once"
    specs = topology.handler_queues(
        work=WORK, routing_key="orders.expire", tiers=[1.0], queue_type="quorum", major=4
    )
    assert [spec.name for spec in specs] == [f"{WORK}.dead", f"{WORK}.retry.1s", WORK]
    assert specs[0].earlier == {"x-queue-type": "quorum"}  # what an earlier release declared
    assert [spec.name for spec in topology.events_queues(3)] == [
        topology.EVENTS_DEAD_QUEUE,
        "dispatcher.events",
    ]


def test_the_broker_major_version_is_read_from_its_version_string() -> None:
    assert topology.major_of("3.10.8") == 3
    assert topology.major_of(b"4.0.5") == 4
    assert topology.major_of("") is None
    assert topology.major_of("x.y") is None


def test_attempt_counts_retries_from_x_death_or_the_sdk_header() -> None:
    assert job_mod.attempt_of({}, WORK) == 1
    deaths = [
        {"queue": f"{WORK}.retry.1s", "reason": "expired", "count": 2},
        {"queue": f"{WORK}.retry.5s", "reason": "expired", "count": 1},
        {"queue": "elsewhere.retry.1s", "reason": "expired", "count": 7},
        {"queue": WORK, "reason": "delivery_limit", "count": 1},
    ]
    assert job_mod.attempt_of({"x-death": deaths}, WORK) == 4
    # RabbitMQ 4 ignores x-death published by a client: the SDK's header still counts.
    assert job_mod.attempt_of({"x-retry-attempt": 6}, WORK) == 6
    assert job_mod.attempt_of({"x-death": deaths, "x-retry-attempt": 2}, WORK) == 4


def test_a_retry_copy_keeps_the_job_and_counts_the_next_attempt() -> None:
    message = delivery("orders.expire", {"x-job-id": "job-1", "tenant": "t1"})
    job = job_mod.from_message(message, work_queue=WORK)
    assert (job.id, job.routing_key, job.attempt, job.headers) == (
        "job-1",
        "orders.expire",
        1,
        {"tenant": "t1"},
    )
    copy = job_mod.retry_copy(job, error="ValueError: boom", work_queue=WORK)
    assert copy.body == message.body
    assert copy.message_id == "job-1"
    assert (copy.priority, copy.correlation_id, copy.expiration) == (4, "c-1", None)
    assert copy.headers["x-retry-attempt"] == 2
    assert copy.headers["x-retry-routing-key"] == "orders.expire"
    assert copy.headers["tenant"] == "t1"
    back = job_mod.from_message(delivery(WORK, dict(copy.headers)), work_queue=WORK)
    assert (back.routing_key, back.attempt) == ("orders.expire", 2)


def test_a_retry_copy_never_names_its_work_queue_in_x_death() -> None:
    deaths = [
        {"queue": f"{WORK}.retry.1s", "reason": "expired", "count": 1},
        {"queue": WORK, "reason": "delivery_limit", "count": 1},
    ]
    job = job_mod.from_message(delivery(WORK, {"x-death": deaths}), work_queue=WORK)
    copy = job_mod.retry_copy(job, error="E", work_queue=WORK)
    assert copy.headers["x-death"] == deaths[:1]  # else RabbitMQ would drop it as a cycle


def test_a_dead_copy_says_why_and_drops_the_retry_history() -> None:
    headers = {
        "x-job-id": "job-1",
        "tenant": "t1",
        "x-retry-attempt": 3,
        "x-retry-routing-key": "orders.expire",
        "x-death": [{"queue": f"{WORK}.retry.1s", "reason": "expired", "count": 2}],
        "x-first-death-queue": f"{WORK}.retry.1s",
    }
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    copy = job_mod.dead_copy(
        delivery(WORK, headers), attempts=3, error="E: x", work_queue=WORK, at=at
    )
    assert copy.headers == {
        "x-job-id": "job-1",
        "tenant": "t1",
        "x-dead-error": "E: x",
        "x-dead-attempts": 3,
        "x-dead-at": "2030-01-02T03:04:05.000Z",
        "x-dead-queue": WORK,
        "x-dead-routing-key": "orders.expire",
    }
    # Moved back by any means (RabbitMQ UI included), it starts afresh with its routing key.
    revived = job_mod.from_message(delivery(WORK, dict(copy.headers)), work_queue=WORK)
    assert (revived.attempt, revived.routing_key) == (1, "orders.expire")
    again = job_mod.revived_copy(delivery(f"{WORK}.dead", dict(copy.headers)))
    assert again.headers == {
        "x-job-id": "job-1",
        "tenant": "t1",
        "x-retry-routing-key": "orders.expire",
    }


def test_a_job_dead_lettered_by_rabbitmq_keeps_its_routing_key() -> None:
    deaths = [{"queue": WORK, "reason": "delivery_limit", "count": 1, "routing-keys": ["o.x"]}]
    message = delivery(f"{WORK}.dead", {"x-death": deaths})
    assert job_mod.routing_key_of(message) == "o.x"
    assert job_mod.revived_copy(message).headers == {"x-retry-routing-key": "o.x"}


@pytest.mark.parametrize(
    ("body", "content_type"), [(b"not json", "application/json"), (b"{}", "text/plain")]
)
def test_a_delivery_off_the_contract_is_undecodable(body: bytes, content_type: str) -> None:
    message = delivery("orders.expire", {}, body)
    message.content_type = content_type
    with pytest.raises(job_mod.Undecodable):
        job_mod.from_message(message, work_queue=WORK)


def test_job_body_for_the_api() -> None:
    run_at = datetime(2030, 1, 1, tzinfo=UTC)
    assert job_body("a", {"x": 1}, delay=timedelta(seconds=1.5), ttl=timedelta(minutes=1)) == {
        "routing_key": "a",
        "payload": {"x": 1},
        "delay_ms": 1500,
        "ttl_ms": 60000,
    }
    assert job_body("a", 1, run_at=run_at, idempotency_key="k")["run_at"] == run_at.isoformat()
    with pytest.raises(ValueError, match="not both"):
        job_body("a", 1, delay=timedelta(1), run_at=run_at)
    with pytest.raises(ValueError, match="timezone"):
        job_body("a", 1, run_at=datetime(2030, 1, 1))


def test_a_timeout_at_or_above_the_brokers_consumer_timeout_is_refused() -> None:
    consumer = Consumer("amqp://x", group="g")
    with pytest.raises(ValueError, match="consumer timeout"):
        consumer.handler("a", timeout=1800)
    tuned = Consumer("amqp://x", group="g", consumer_timeout_s=60)
    with pytest.raises(ValueError, match="consumer timeout"):
        tuned.handler("a", timeout=90)
    tuned.handler("a", timeout=59)


async def test_the_memory_deduplicator_forgets_the_oldest_ids() -> None:
    dedup = MemoryDeduplicator(capacity=2)
    for job_id in ("a", "b", "c"):
        await dedup.remember(job_id)
    assert [await dedup.seen(job_id) for job_id in ("a", "b", "c")] == [False, True, True]


def test_dlq_names_a_work_queue_only_for_a_dead_queue() -> None:
    assert work_queue_of("billing.orders.expire.dead") == WORK
    with pytest.raises(DlqError):
        work_queue_of(WORK)
