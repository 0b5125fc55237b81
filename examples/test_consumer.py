"""Tests of examples/consumer.py's handler, without a broker: the SDK's pytest plugin gives the
fixtures (with pytest-asyncio, or any plugin that runs async tests).

pytest examples/test_consumer.py
"""

from consumers_sdk.testing import HandlerRunner, JobFactory
from examples.consumer import consumer


async def test_an_order_expiry_is_acked(
    dispatcher_job: JobFactory, run_handler: HandlerRunner
) -> None:
    outcome = await run_handler(consumer, "orders.expire", dispatcher_job({"order": 42}))
    assert outcome.kind == "acked"


async def test_a_job_without_an_order_is_retried_then_dead(
    dispatcher_job: JobFactory, run_handler: HandlerRunner
) -> None:
    first = await run_handler(consumer, "orders.expire", dispatcher_job({"customer": 7}))
    assert (first.kind, first.reason) == ("retried", "KeyError: 'order'")
    # polynomial(15, 3600) after attempt 1: 1**4 + 15 plus up to 60 s of jitter
    assert first.delay_s is not None
    assert 16 <= first.delay_s <= 76
    fifth = dispatcher_job({"customer": 7}, attempt=5)  # the handler's max_attempts
    last = await run_handler(consumer, "orders.expire", fifth)
    assert (last.kind, last.attempt) == ("dead", 5)


async def test_the_jobs_own_retry_policy_wins(
    dispatcher_job: JobFactory, run_handler: HandlerRunner
) -> None:
    job = dispatcher_job({}, max_attempts=2, retry_backoff=[5])
    outcome = await run_handler(consumer, "orders.expire", job)
    assert (outcome.kind, outcome.delay_s) == ("retried", 5.0)
    job = dispatcher_job({}, attempt=2, max_attempts=2)
    assert (await run_handler(consumer, "orders.expire", job)).kind == "dead"
