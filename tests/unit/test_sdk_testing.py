"""consumers_sdk.testing: a job built without a broker, and a handler's outcome under the
consumer's own rules (the decision the consumer settles its deliveries by)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta

import pytest

from consumers_sdk import Consumer, Job, Reject, Retry
from consumers_sdk.testing import HandlerRunner, JobFactory, handler_for, make_job, run_handler
from consumers_sdk.testing.handlers import topic_matches

TIERS = (1.0, 5.0, 15.0, 60.0)
KEY = "orders.expire"


def consumer() -> Consumer:
    return Consumer("amqp://unused", group="billing", retry_tiers=TIERS, report_events=False)


def failing(error: Exception, *, max_attempts: int = 3, timeout: float = 30.0) -> Consumer:
    """A consumer whose handler for KEY raises ``error``; its backoff is 3 s per attempt."""
    built = consumer()

    @built.handler(KEY, max_attempts=max_attempts, timeout=timeout, backoff=lambda n: 3.0 * n)
    async def handle(job: Job) -> None:
        raise error

    return built


def test_a_built_job_reads_as_the_delivery_the_dispatcher_publishes() -> None:
    job = make_job(
        {"order": 42, "lines": (1, 2)},
        headers={"tenant": "t1"},
        attempt=3,
        routing_key=KEY,
        idempotency_key="order-42",
    )
    assert job.payload == {"order": 42, "lines": [1, 2]}  # through JSON, as on the wire
    assert (job.routing_key, job.attempt, job.idempotency_key) == (KEY, 3, "order-42")
    assert job.headers == {"tenant": "t1"}  # the contract's own headers are not the producer's
    assert uuid.UUID(job.id)
    assert job.run_at is not None
    assert job.run_at.tzinfo is not None
    assert job.dispatch_round is not None
    assert make_job(None, job_id="job-1").id == "job-1"


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"headers": {"x-retry-attempt": 2}}, "reserved"),
        ({"attempt": 0}, "attempt"),
        ({"routing_key": "orders.*"}, "routing_key"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"retry_backoff": [1, -1]}, r"retry_backoff\[1\]"),
    ],
)
def test_a_job_the_dispatcher_could_not_publish_is_refused_by_name(
    arguments: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        make_job({}, **arguments)


async def test_a_handler_that_returns_is_acked() -> None:
    built = consumer()
    seen: list[object] = []

    @built.handler(KEY)
    async def handle(job: Job) -> None:
        seen.append(job.payload)

    outcome = await run_handler(built, KEY, make_job({"order": 1}))
    assert (outcome.kind, outcome.attempt, outcome.delay_s, outcome.reason) == (
        "acked",
        1,
        None,
        None,
    )
    assert seen == [{"order": 1}]


async def test_a_failed_attempt_is_retried_after_its_backoff_rounded_up_to_a_tier() -> None:
    built = failing(ValueError("boom"))
    first = await run_handler(built, KEY, make_job({}))
    assert (first.kind, first.delay_s, first.tier_s) == ("retried", 3.0, 5.0)
    assert (first.reason, first.timed_out) == ("ValueError: boom", False)
    second = await run_handler(built, KEY, make_job({}, attempt=2))
    assert (second.kind, second.delay_s, second.tier_s) == ("retried", 6.0, 15.0)


async def test_once_its_attempts_are_spent_the_job_is_dead_with_the_reason() -> None:
    outcome = await run_handler(failing(ValueError("boom")), KEY, make_job({}, attempt=3))
    assert (outcome.kind, outcome.attempt, outcome.reason) == ("dead", 3, "ValueError: boom")
    assert outcome.delay_s is None


async def test_retry_sets_the_delay_but_not_the_number_of_attempts() -> None:
    built = failing(Retry(delay=timedelta(seconds=40)))
    outcome = await run_handler(built, KEY, make_job({}))
    assert (outcome.kind, outcome.delay_s, outcome.tier_s) == ("retried", 40.0, 60.0)
    assert (await run_handler(built, KEY, make_job({}, attempt=3))).kind == "dead"


async def test_reject_parks_the_job_at_once_with_its_reason() -> None:
    outcome = await run_handler(failing(Reject("no such order")), KEY, make_job({}))
    assert (outcome.kind, outcome.attempt, outcome.reason) == ("dead", 1, "Reject: no such order")


async def test_a_handler_past_its_timeout_is_a_timed_out_failed_attempt() -> None:
    built = consumer()

    @built.handler(KEY, timeout=0.05, backoff=lambda n: 1.0)
    async def hang(job: Job) -> None:
        await asyncio.sleep(3600)

    outcome = await asyncio.wait_for(run_handler(built, KEY, make_job({})), timeout=60)
    assert (outcome.kind, outcome.timed_out, outcome.tier_s) == ("retried", True, 1.0)
    assert outcome.reason is not None
    assert outcome.reason.startswith("HandlerTimeout: ")


async def test_a_sync_handler_runs_in_a_thread_and_counts_as_timed_out_past_its_timeout() -> None:
    built = consumer()
    release = threading.Event()
    threads: list[int] = []

    @built.handler(KEY, timeout=0.05, max_attempts=1)
    def block(job: Job) -> None:
        threads.append(threading.get_ident())
        release.wait(60)

    try:
        outcome = await asyncio.wait_for(run_handler(built, KEY, make_job({})), timeout=60)
    finally:
        release.set()  # the thread runs on past the timeout: let it end
    assert (outcome.kind, outcome.timed_out) == ("dead", True)
    assert len(threads) == 1
    assert threads[0] != threading.get_ident()


async def test_the_jobs_own_retry_policy_wins_over_the_handlers() -> None:
    built = failing(ValueError("boom"), max_attempts=5)
    job = make_job({}, max_attempts=2, retry_backoff=[timedelta(seconds=2)])
    first = await run_handler(built, KEY, job)
    assert (first.kind, first.delay_s, first.tier_s) == ("retried", 2.0, 5.0)
    last = await run_handler(built, KEY, make_job({}, attempt=2, max_attempts=2))
    assert last.kind == "dead"


async def test_the_fixtures_of_the_sdks_pytest_plugin(
    dispatcher_job: JobFactory, run_handler: HandlerRunner
) -> None:
    outcome = await run_handler(failing(Reject("bad")), KEY, dispatcher_job({"order": 1}))
    assert (outcome.kind, outcome.reason) == ("dead", "Reject: bad")


def test_a_routing_key_finds_its_handler_by_its_own_key_or_the_one_pattern_matching_it() -> None:
    built = consumer()
    for key in ("orders.expire", "orders.*", "billing.#"):
        built.handler(key)(lambda job: None)
    assert handler_for(built, "orders.expire").routing_key == "orders.expire"
    assert handler_for(built, "orders.*").routing_key == "orders.*"
    assert handler_for(built, "orders.paid").routing_key == "orders.*"
    assert handler_for(built, "billing.invoice.sent").routing_key == "billing.#"
    with pytest.raises(LookupError, match=r"registered: orders\.expire, orders\.\*, billing\.#"):
        handler_for(built, "shipping.sent")
    built.handler("#.paid")(lambda job: None)
    with pytest.raises(ValueError, match="several handlers"):
        handler_for(built, "orders.paid")


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.*", "a", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#", "anything.at.all", True),
        ("#.c", "a.b.c", True),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.b.d", False),
        ("*.b", "a.c", False),
    ],
)
def test_patterns_follow_rabbitmqs_topic_rule(pattern: str, key: str, matches: bool) -> None:
    assert topic_matches(pattern, key) is matches
