"""DispatcherClient against an in-process dispatcher (real PostgreSQL and RabbitMQ), and both
clients' retries through a transport that fails on purpose."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from consumers_sdk import (
    DispatcherClient,
    DispatcherUnavailable,
    InvalidJob,
    JobConflict,
    JobNotFound,
    SyncDispatcherClient,
)
from consumers_sdk.client import job_body
from tests.support import answers
from tests.support.nodes import running_node


@pytest.fixture
async def client(database_url: str, amqp_url: str) -> AsyncIterator[DispatcherClient]:
    async with running_node(database_url=database_url, amqp_url=amqp_url, shard_count=8) as node:
        yield DispatcherClient(
            "http://127.0.0.1", transport=httpx.ASGITransport(app=node.serving.app)
        )


async def test_schedule_get_cancel_and_typed_errors(client: DispatcherClient) -> None:
    job = await client.schedule(
        "orders.expire", {"order": 1}, delay=timedelta(minutes=5), idempotency_key="k1"
    )
    assert job.state == "scheduled"
    assert (await client.get(job.id)).idempotency_key == "k1"
    assert (await client.cancel(job.id)).state == "cancelled"
    with pytest.raises(JobConflict) as conflict:
        await client.cancel(job.id)
    assert conflict.value.state == "cancelled"
    with pytest.raises(JobNotFound):
        await client.get("01890000-0000-7000-8000-000000000000")
    with pytest.raises(InvalidJob) as invalid:
        await client.schedule("orders.*", 1)
    assert invalid.value.body["fields"][0]["field"] == "routing_key"  # type: ignore[index]


async def test_schedule_many_and_the_job_decorator(client: DispatcherClient) -> None:
    batch = await client.schedule_many(
        [{"routing_key": "a.b", "payload": i, "delay_ms": 60_000} for i in range(3)]
    )
    assert len(batch) == 3

    @client.job("orders.expire", priority=3)
    def expire_order(order: int) -> int:
        return order * 2

    assert expire_order(21) == 42  # still a plain function
    scheduled = await expire_order.schedule({"order": 7}, delay=timedelta(seconds=30))
    assert scheduled.routing_key == "orders.expire"
    assert scheduled.priority == 3


async def test_503_and_lost_connections_are_retried_then_reported() -> None:
    calls = 0

    def flaky(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls <= 2:
            return answers.problem(503, "unavailable", "later")
        return answers.job_answer(201)

    client = DispatcherClient("http://node", transport=httpx.MockTransport(flaky), retries=3)
    assert (await client.schedule("a", 1)).created is True
    assert calls == 3

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    gone = DispatcherClient("http://node", transport=httpx.MockTransport(down), retries=1)
    with pytest.raises(DispatcherUnavailable):
        await gone.get("x")
    await client.close()
    await gone.close()


async def test_a_lost_answer_is_replayed_only_when_replaying_is_harmless() -> None:
    calls: list[str] = []

    def answer_lost(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            raise httpx.ReadTimeout("sent, but no answer")
        return answers.job_answer()

    client = DispatcherClient("http://node", transport=httpx.MockTransport(answer_lost), retries=3)
    # Without an idempotency key a replay could schedule the job twice: reported, not replayed.
    with pytest.raises(DispatcherUnavailable):
        await client.schedule("a", 1)
    assert calls == ["POST"]
    calls.clear()
    job = await client.schedule("a", 1, idempotency_key="k")
    assert calls == ["POST", "POST"]
    calls.clear()
    assert (await client.get(job.id)).id == job.id
    assert calls == ["GET", "GET"]
    await client.close()


def test_the_sync_client_retries_and_replays_by_the_same_rules() -> None:
    sent: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        if len(sent) == 1:
            return answers.problem(503, "unavailable", "later")
        if len(sent) == 2:
            raise httpx.ReadTimeout("sent, but no answer")
        return answers.job_answer()

    with SyncDispatcherClient("http://node", transport=httpx.MockTransport(flaky)) as client:
        assert client.get("x").routing_key == "orders.expire"  # 503, lost, then answered
    assert sent == ["GET", "GET", "GET"]

    def answer_lost(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        raise httpx.ReadTimeout("sent, but no answer")

    sent.clear()
    lossy = SyncDispatcherClient("http://node", transport=httpx.MockTransport(answer_lost))
    with lossy, pytest.raises(DispatcherUnavailable):
        lossy.cancel("x")  # a replay would report the job as already cancelled
    assert sent == ["DELETE"]


def test_the_sync_clients_job_decorator_schedules_at_once() -> None:
    bodies: list[bytes] = []

    def store(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return answers.job_answer(201)

    with SyncDispatcherClient("http://node", transport=httpx.MockTransport(store)) as client:

        @client.job("orders.expire", priority=3)
        def expire_order(order: int) -> int:
            return order * 2

        assert expire_order(21) == 42
        scheduled = expire_order.schedule({"order": 7}, delay=30)
    assert scheduled.created is True
    assert [json.loads(body) for body in bodies] == [
        {"routing_key": "orders.expire", "payload": {"order": 7}, "delay_ms": 30_000, "priority": 3}
    ]


async def test_a_known_key_keeps_replaces_or_extends_its_pending_job_and_says_which(
    client: DispatcherClient,
) -> None:
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    first = await client.schedule(
        "users.remind", {"v": 1}, run_at=later, idempotency_key="u1", release_key="dispatched"
    )
    assert (first.outcome, first.release_key, first.key_released) == (
        "created",
        "dispatched",
        False,
    )
    replaced = await client.schedule(
        "users.remind",
        {"v": 2},
        run_at=later + timedelta(minutes=10),
        idempotency_key="u1",
        on_existing="replace",
    )
    assert (replaced.id, replaced.created, replaced.outcome) == (first.id, False, "replaced")
    assert (replaced.payload, replaced.run_at) == ({"v": 2}, later + timedelta(minutes=10))
    sooner = await client.schedule(
        "users.remind", {"v": 3}, run_at=later, idempotency_key="u1", on_existing="extend"
    )
    assert (sooner.outcome, sooner.run_at) == ("kept", replaced.run_at)
    [extended, created] = await client.schedule_many(
        [
            job_body(
                "users.remind",
                {"v": 4},
                run_at=later + timedelta(minutes=20),
                idempotency_key="u1",
                on_existing="extend",
            ),
            job_body("users.remind", {"v": 5}, idempotency_key="u2", on_existing="extend"),
        ]
    )
    assert (extended.outcome, extended.payload) == ("extended", {"v": 2})  # the time only
    assert (created.outcome, created.created) == ("created", True)
    refused = await client.schedule(
        "users.other", {}, run_at=later, idempotency_key="u1", on_existing="replace"
    )
    assert (refused.outcome, refused.routing_key) == ("refused", "users.remind")
    history = (await client.get(first.id)).history
    assert [step.event for step in history] == ["scheduled", "replaced", "extended"]
    assert history[2].detail is not None
    assert history[2].detail.startswith("run_at ")
    with pytest.raises(InvalidJob) as invalid:
        await client.schedule("users.remind", {}, on_existing="replace")  # no key
    assert invalid.value.body["fields"][0]["field"] == "on_existing"  # type: ignore[index]
