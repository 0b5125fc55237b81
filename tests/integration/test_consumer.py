"""The SDK's Consumer against a real RabbitMQ: acks, retries through wait queues, dead letters."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import httpx
import pytest

from consumers_sdk import Consumer, Job, MemoryDeduplicator, Reject, Retry, contract, topology
from devstack.jobs_out import job, new_id, publish, publish_raw
from devstack.ports import reserve_port
from devstack.rabbitmq import RabbitServer
from tests.support.consumers import running
from tests.support.queues import depth_reaches, queue_depth
from tests.support.waiting import eventually

# The outcome depends on the broker's version: run again on RabbitMQ 4.x (make test).
pytestmark = pytest.mark.rabbitmq_version


TIERS = (0.3, 0.6, 1.2)
WORK = "billing.orders.expire"


def fixed(seconds: float) -> Callable[[int], float]:
    return lambda _attempt: seconds


async def peek_via_management(
    rabbit: RabbitServer, amqp_url: str, queue: str
) -> list[dict[str, Any]]:
    vhost = urlsplit(amqp_url).path.lstrip("/")
    async with httpx.AsyncClient(base_url=rabbit.mgmt_url, auth=("guest", "guest")) as http:
        response = await http.post(
            f"/api/queues/{vhost}/{queue}/get",
            json={"count": 10, "ackmode": "ack_requeue_true", "encoding": "auto"},
        )
    response.raise_for_status()
    messages: list[dict[str, Any]] = response.json()
    return messages


async def test_a_handler_failing_twice_is_retried_after_its_backoff_and_acked_once(
    amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="consumers_sdk.delivery")
    consumer = Consumer(amqp_url, group="billing", prefetch=4, retry_tiers=TIERS)
    seen: list[tuple[float, int]] = []

    @consumer.handler("orders.expire", max_attempts=5, backoff=fixed(0.3))
    async def expire(job: Job) -> None:
        seen.append((time.monotonic(), job.attempt))
        if len(seen) < 3:
            raise RuntimeError("flaky")

    async with running(consumer):
        [job_id] = await publish(amqp_url, [job("orders.expire", {"order": 1})])
        await eventually(lambda: len(seen) == 3, 20)
        await asyncio.sleep(0.5)  # room for a wrong fourth delivery
    assert [attempt for _, attempt in seen] == [1, 2, 3]
    # Each failed attempt is logged, with the handler's traceback: a retry is not silent.
    failed = [r for r in caplog.records if "failed, again in" in r.getMessage()]
    assert [r.getMessage().split(" failed")[0] for r in failed] == [
        f"job {job_id} (orders.expire) attempt {attempt}" for attempt in (1, 2)
    ]
    assert all(r.exc_info and "flaky" in str(r.exc_info[1]) for r in failed)
    assert "in expire" in caplog.text  # the handler's frame
    # Each retry waits out its tier (0.3 s), give or take a loaded machine's scheduling.
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(seen)]
    assert all(0.3 <= gap < 0.3 + 1.5 for gap in gaps), gaps
    # Acked once, after the third delivery: nothing waits, nothing is dead, nothing came back.
    for queue in (WORK, topology.dead_queue(WORK), *(topology.wait_queue(WORK, t) for t in TIERS)):
        assert await queue_depth(amqp_url, queue) == 0, queue
    assert job_id


async def test_a_handler_that_always_fails_is_tried_max_attempts_then_dead(
    amqp_url: str, rabbit_server: RabbitServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="consumers_sdk.delivery")
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
    attempts: list[int] = []

    @consumer.handler("orders.expire", max_attempts=3, backoff=fixed(0.3))
    async def expire(job: Job) -> None:
        attempts.append(job.attempt)
        raise ValueError("boom")

    async with running(consumer):
        [job_id] = await publish(amqp_url, [job("orders.expire", {"order": 2})])
        await eventually(lambda: len(attempts) == 3, 20)
        await asyncio.sleep(0.5)
    assert attempts == [1, 2, 3]
    [dead_line] = [r for r in caplog.records if "dead after 3 attempts" in r.getMessage()]
    assert dead_line.exc_info is not None  # with the last attempt's traceback
    assert "ValueError: boom" in caplog.text
    [dead] = await peek_via_management(rabbit_server, amqp_url, topology.dead_queue(WORK))
    headers = dead["properties"]["headers"]
    assert dead["properties"]["message_id"] == job_id
    assert dead["payload"] == '{"order":2}'
    assert headers["x-dead-error"] == "ValueError: boom"
    assert headers["x-dead-attempts"] == 3
    assert headers["x-dead-routing-key"] == "orders.expire"
    assert headers["x-dead-queue"] == WORK
    died_at = datetime.fromisoformat(headers["x-dead-at"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - died_at).total_seconds()) < 60
    # Body and properties kept; the retry bookkeeping is not (a revived job starts afresh).
    assert dead["properties"]["content_type"] == "application/json"
    assert dead["properties"]["delivery_mode"] == 2
    assert headers["x-job-id"] == job_id
    assert headers["tenant"] == "t1"
    assert not [name for name in headers if name.startswith(("x-death", "x-retry-"))]
    assert await queue_depth(amqp_url, WORK) == 0


async def test_a_short_retry_is_not_held_behind_a_long_one(amqp_url: str) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
    second_delivery: dict[str, float] = {}

    @consumer.handler("orders.expire", max_attempts=3)
    async def expire(job: Job) -> None:
        if job.attempt == 1:
            raise Retry(delay=1.2 if job.payload == "long" else 0.3)
        second_delivery[job.payload] = time.monotonic()

    async with running(consumer):
        await publish(amqp_url, [job("orders.expire", "long")])
        await publish(amqp_url, [job("orders.expire", "short")])
        await eventually(lambda: len(second_delivery) == 2, 20)
    assert second_delivery["short"] < second_delivery["long"]


async def test_prefetch_bounds_the_jobs_in_flight(amqp_url: str) -> None:
    consumer = Consumer(amqp_url, group="billing", prefetch=3, retry_tiers=TIERS)
    done: list[str] = []
    running_now = 0
    most = 0

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        nonlocal running_now, most
        running_now += 1
        most = max(most, running_now)
        await asyncio.sleep(0.05)
        running_now -= 1
        done.append(job.id)

    async with running(consumer):
        ids = await publish(amqp_url, [job("orders.expire", i) for i in range(30)])
        await eventually(lambda: len(done) == 30, 30)
    assert sorted(done) == sorted(ids)
    assert most == 3
    assert consumer.max_in_flight <= 3


async def publish_without_message_id(
    rabbit: RabbitServer, amqp_url: str, routing_key: str, body: bytes
) -> None:
    """Through the management API: aiormq gives every message it publishes a message_id."""
    vhost = urlsplit(amqp_url).path.lstrip("/")
    async with httpx.AsyncClient(base_url=rabbit.mgmt_url, auth=("guest", "guest")) as http:
        response = await http.post(
            f"/api/exchanges/{vhost}/{contract.EXCHANGE}/publish",
            json={
                "routing_key": routing_key,
                "payload": body.decode(),
                "payload_encoding": "string",
                "properties": {"content_type": "application/json", "delivery_mode": 2},
            },
        )
    response.raise_for_status()
    assert response.json()["routed"] is True


async def test_reject_and_malformed_deliveries_go_straight_to_dead_and_block_nothing(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
    handled: list[Any] = []

    @consumer.handler("orders.expire", max_attempts=5)
    async def expire(job: Job) -> None:
        handled.append(job.payload)
        if job.payload == "poison":
            raise Reject("cannot expire a paid order")

    malformed = {
        "not JSON": aio_pika.Message(
            b"not json", content_type="application/json", message_id="m-1"
        ),
        "wrong content type": aio_pika.Message(b"{}", content_type="text/plain", message_id="m-2"),
    }
    async with running(consumer):
        await publish(amqp_url, [job("orders.expire", "poison")])
        for message in malformed.values():
            await publish_raw(amqp_url, "orders.expire", message)
        await publish_without_message_id(rabbit_server, amqp_url, "orders.expire", b"{}")
        # Good jobs behind the malformed ones are handled: the queue is not blocked.
        await publish(amqp_url, [job("orders.expire", f"fine-{i}") for i in range(5)])
        await eventually(lambda: len(handled) == 6, 20)
        await depth_reaches(amqp_url, topology.dead_queue(WORK), 4, 10)
    assert handled.count("poison") == 1
    assert sorted(handled[1:]) == [f"fine-{i}" for i in range(5)]
    dead = await peek_via_management(rabbit_server, amqp_url, topology.dead_queue(WORK))
    reasons = sorted(m["properties"]["headers"]["x-dead-error"] for m in dead)
    assert [reason.split(":")[0] for reason in reasons] == ["Reject"] + ["Undecodable"] * 3
    assert any("content_type 'text/plain'" in reason for reason in reasons), reasons
    assert any("neither message_id nor x-job-id" in reason for reason in reasons), reasons
    assert any("JSON" in reason or "json" in reason for reason in reasons[1:]), reasons
    assert await queue_depth(amqp_url, WORK) == 0


async def test_sync_handlers_run_off_the_event_loop_and_timeouts_count_as_failures(
    amqp_url: str,
) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
    threads: list[bool] = []
    attempts: list[int] = []
    errors: list[object] = []

    @consumer.handler("orders.sync", max_attempts=3, backoff=fixed(0.3))
    def in_thread(job: Job) -> None:
        threads.append(threading.current_thread() is threading.main_thread())

    @consumer.handler("orders.slow", max_attempts=3, timeout=0.2, backoff=fixed(0.3))
    async def slow(job: Job) -> None:
        attempts.append(job.attempt)
        errors.append(job.message.headers.get("x-retry-last-error"))
        if job.attempt == 1:
            await asyncio.sleep(5)

    async with running(consumer):
        await publish(amqp_url, [job("orders.sync", 1), job("orders.slow", 2)])
        await eventually(lambda: bool(threads) and attempts == [1, 2], 20)
    assert threads == [False]
    assert errors == [None, "HandlerTimeout: handler ran past its timeout of 0.2s"]


async def test_the_dedup_hook_skips_a_job_id_already_handled(amqp_url: str) -> None:
    consumer = Consumer(
        amqp_url, group="billing", retry_tiers=TIERS, deduplicator=MemoryDeduplicator()
    )
    handled: list[str] = []

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        handled.append(job.id)

    same = job("orders.expire", 1)
    async with running(consumer):
        await publish(amqp_url, [same])
        await eventually(lambda: len(handled) == 1, 10)
        await publish(amqp_url, [same, job("orders.expire", 2)])  # a duplicate delivery
        await eventually(lambda: len(handled) == 2, 10)
        await asyncio.sleep(0.3)
    assert handled[0] == str(same.id)
    assert handled.count(str(same.id)) == 1


class FailingStore:
    """A user's deduplicator whose store fails for one job id: an error outside the handler."""

    def __init__(self, failing_id: str) -> None:
        self.failing_id = failing_id

    async def seen(self, job_id: str) -> bool:
        if job_id == self.failing_id:
            raise ConnectionError("dedup store unreachable")
        return False

    async def remember(self, job_id: str) -> None:
        return None


async def test_an_error_outside_the_handler_leaves_its_delivery_unacked_and_the_consumer_running(
    amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    bad, good = job("orders.expire", 1), job("orders.expire", 2)
    consumer = Consumer(
        amqp_url, group="billing", retry_tiers=TIERS, deduplicator=FailingStore(str(bad.id))
    )
    handled: list[str] = []

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        handled.append(job.id)

    caplog.set_level(logging.ERROR, logger="consumers_sdk.consumer")
    async with running(consumer):
        await publish(amqp_url, [bad, good])
        await eventually(lambda: handled == [str(good.id)], 10)
        await eventually(lambda: "delivery handling crashed" in caplog.text, 10)
        assert await queue_depth(amqp_url, WORK) == 0  # held unacked, not moved anywhere
    await depth_reaches(amqp_url, WORK, 1, 10)  # handed back when the consumer's channel closed
    assert handled == [str(good.id)]


async def test_stop_finishes_the_jobs_in_flight_and_acks_them(amqp_url: str) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
    started = asyncio.Event()
    finished: list[str] = []

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        started.set()
        await asyncio.sleep(0.5)
        finished.append(job.id)

    async with running(consumer):
        await publish(amqp_url, [job("orders.expire", 1)])
        await asyncio.wait_for(started.wait(), 10)
    assert len(finished) == 1
    assert await queue_depth(amqp_url, WORK) == 0


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_both_queue_types_retry(amqp_url: str, queue_type: str) -> None:
    consumer = Consumer(amqp_url, group="ops", retry_tiers=TIERS, queue_type=queue_type)  # type: ignore[arg-type]
    attempts: list[int] = []

    @consumer.handler("reports.#", max_attempts=3, backoff=fixed(0.3))
    async def report(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            raise RuntimeError("once")
        assert job.routing_key == "reports.daily"

    async with running(consumer):
        await publish(amqp_url, [job("reports.daily", 1)])
        await eventually(lambda: attempts == [1, 2], 20)


async def test_a_broker_restart_loses_nothing_and_the_consumer_resumes(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    consumer = Consumer(amqp_url, group="billing", prefetch=5, retry_tiers=TIERS)
    handled: dict[str, int] = {}

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        await asyncio.sleep(0.02)
        handled[job.id] = handled.get(job.id, 0) + 1

    async with running(consumer):
        ids = await publish(amqp_url, [job("orders.expire", i) for i in range(200)])
        await eventually(lambda: len(handled) >= 30, 20)
        await asyncio.to_thread(rabbit_server.restart)
        await eventually(lambda: set(ids) <= handled.keys(), 60)
    duplicates = sum(count - 1 for count in handled.values())
    print(f"\nbroker restart: {len(handled)} handled, {duplicates} handled twice")
    assert set(ids) <= handled.keys()


async def test_max_per_second_spaces_out_handler_starts(amqp_url: str) -> None:
    consumer = Consumer(amqp_url, group="billing", max_per_second=20, retry_tiers=TIERS)
    starts: list[float] = []

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        starts.append(time.monotonic())

    async with running(consumer):
        await publish(amqp_url, [job("orders.expire", i) for i in range(10)])
        await eventually(lambda: len(starts) == 10, 20)
    # 10 starts at 20 per second cannot span less than 9 intervals of 50 ms.
    assert starts[-1] - starts[0] >= 9 * 0.05 - 0.01


async def test_stop_past_its_deadline_leaves_unfinished_jobs_to_be_redelivered(
    amqp_url: str,
) -> None:
    consumer = Consumer(
        amqp_url,
        group="billing",
        prefetch=3,
        concurrency=1,
        stop_timeout_s=0.5,
        retry_tiers=TIERS,
    )
    started: list[str] = []

    @consumer.handler("orders.expire")
    async def expire(job: Job) -> None:
        started.append(job.id)
        await asyncio.sleep(25)

    task = asyncio.create_task(consumer.run(handle_signals=False))
    await asyncio.wait_for(consumer.ready.wait(), 30)
    await publish(amqp_url, [job("orders.expire", i) for i in range(3)])
    await eventually(lambda: len(started) == 1, 10)
    consumer.stop()
    await asyncio.wait_for(task, 10)  # the deadline, not the handler's 25 s
    # One was cancelled mid-handler and two never started: none acked, all three back.
    assert len(started) == 1
    await depth_reaches(amqp_url, WORK, 3, 10)  # returned as the channel closed


async def test_a_retry_copy_that_reaches_no_queue_is_not_lost(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=(0.3,))
    attempts: list[int] = []

    @consumer.handler("orders.expire", max_attempts=5, backoff=fixed(0.3))
    async def expire(job: Job) -> None:
        attempts.append(job.attempt)
        raise RuntimeError("fails")

    async with running(consumer):
        connection = await aio_pika.connect(amqp_url)
        channel = await connection.channel()
        await channel.queue_delete(topology.wait_queue(WORK, 0.3))  # an operator's mistake
        await connection.close()
        await publish(amqp_url, [job("orders.expire", 1)])
        # Every move is refused, so the original is handed back each time, until the quorum
        # queue's delivery limit parks it in .dead.
        await eventually(lambda: len(attempts) > topology.POISON_DELIVERY_LIMIT, 60)
        await depth_reaches(amqp_url, topology.dead_queue(WORK), 1, 10)
    assert set(attempts) == {1}, "it never went through a wait queue"
    [dead] = await peek_via_management(rabbit_server, amqp_url, topology.dead_queue(WORK))
    [death] = dead["properties"]["headers"]["x-death"]
    assert (death["queue"], death["reason"]) == (WORK, "delivery_limit")


async def test_topology_and_connection_name_as_documented_and_declared_idempotently(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    def consumer() -> Consumer:
        made = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
        made.handler("orders.expire")(lambda job: None)
        return made

    async with running(consumer()), running(consumer()):  # two consumers, the same queues
        vhost = urlsplit(amqp_url).path.lstrip("/")
        async with httpx.AsyncClient(
            base_url=rabbit_server.mgmt_url, auth=("guest", "guest")
        ) as http:
            queues = (await http.get(f"/api/queues/{vhost}")).json()
            bindings = (
                await http.get(f"/api/exchanges/{vhost}/dispatcher.jobs/bindings/source")
            ).json()

            # Named connections, from the node (the management API lists them only with metrics).
            async with asyncio.timeout(20):
                while rabbit_server.connection_names(vhost).count("consumer-billing") < 2:  # noqa: ASYNC110
                    await asyncio.sleep(0.3)
    by_name = {queue["name"]: queue for queue in queues}
    assert set(by_name) == {
        WORK,
        f"{WORK}.dead",
        f"{WORK}.retry.300ms",
        f"{WORK}.retry.600ms",
        f"{WORK}.retry.1200ms",
        contract.EVENTS_QUEUE,  # the dispatchers' events queue, declared by the reporter too
        topology.EVENTS_DEAD_QUEUE,
    }
    assert all(queue["durable"] and queue["type"] == "quorum" for queue in queues)
    assert by_name[WORK]["arguments"]["x-dead-letter-strategy"] == "at-least-once"
    assert by_name[f"{WORK}.retry.600ms"]["arguments"]["x-message-ttl"] == 600
    assert by_name[f"{WORK}.retry.600ms"]["arguments"]["x-dead-letter-routing-key"] == WORK
    assert [(b["destination"], b["routing_key"]) for b in bindings] == [(WORK, "orders.expire")]
    # Every queue states its delivery limit: none is left to a broker's default.
    limits = {name: queue["arguments"].get("x-delivery-limit") for name, queue in by_name.items()}
    assert limits[WORK] == limits[f"{WORK}.retry.600ms"] == limits[contract.EVENTS_QUEUE] == 50
    dead_limit = -1 if rabbit_server.major >= 4 else None  # 3.x: no default limit, -1 drops
    assert limits[f"{WORK}.dead"] == limits[topology.EVENTS_DEAD_QUEUE] == dead_limit


async def test_a_consumer_waits_for_an_unreachable_broker_until_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = Consumer(f"amqp://guest:guest@127.0.0.1:{reserve_port()}/", group="billing")
    consumer.handler("orders.expire")(lambda job: None)
    caplog.set_level(logging.WARNING, logger="consumers_sdk.consumer")
    task = asyncio.create_task(consumer.run(handle_signals=False))
    await eventually(lambda: caplog.text.count("RabbitMQ not reachable") >= 2, 10)
    consumer.stop()
    await asyncio.wait_for(task, 10)
    assert not consumer.ready.is_set()


async def test_a_job_rabbitmq_dead_lettered_and_moved_back_by_hand_still_retries(
    amqp_url: str,
) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS)
    attempts: list[int] = []

    @consumer.handler("orders.expire", max_attempts=3, backoff=fixed(0.3))
    async def expire(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            raise RuntimeError("once")

    async with running(consumer):
        # What the RabbitMQ UI's "Move messages" puts back from .dead after the quorum delivery
        # limit parked a job there: its x-death names the work queue. Retried as it is, the job
        # would come back to a queue its x-death names, and RabbitMQ would drop it as a cycle.
        death = {"queue": WORK, "reason": "delivery_limit", "count": 1, "exchange": ""}
        death["routing-keys"] = ["orders.expire"]
        message = aio_pika.Message(
            b"{}",
            content_type="application/json",
            message_id=new_id(),
            headers={"x-death": [death]},
        )
        connection = await aio_pika.connect(amqp_url)
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(message, routing_key=WORK)
        await connection.close()
        await eventually(lambda: attempts == [1, 2], 20)
