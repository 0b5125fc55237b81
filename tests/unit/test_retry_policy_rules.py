"""A job's own retry policy: its contract headers and how it maps onto the consumer's tiers."""

from __future__ import annotations

from datetime import timedelta

import pytest

from consumers_sdk import Consumer, Job, Retry, contract, retry, validation
from consumers_sdk.client import job_body
from consumers_sdk.contract import RetryPolicy
from consumers_sdk.testing import make_job, run_handler

TIERS = (1.0, 5.0, 15.0, 60.0)


def handler_backoff(attempt: int) -> float:
    return 100.0 * attempt


def delay(attempt: int, policy: RetryPolicy) -> float | None:
    return retry.next_delay(attempt, max_attempts=4, backoff=handler_backoff, policy=policy)


def test_without_a_policy_the_handler_defaults_apply() -> None:
    assert [delay(n, RetryPolicy()) for n in (1, 2, 3, 4)] == [100.0, 200.0, 300.0, None]


def test_the_jobs_max_attempts_overrides_the_handlers_either_way() -> None:
    assert [delay(n, RetryPolicy(max_attempts=2)) for n in (1, 2)] == [100.0, None]
    assert delay(4, RetryPolicy(max_attempts=6)) == 400.0
    assert delay(5, RetryPolicy(max_attempts=6)) == 500.0
    assert delay(6, RetryPolicy(max_attempts=6)) is None


def test_the_jobs_backoff_gives_one_step_per_attempt_the_last_repeated() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_s=(1.0, 5.0, 30.0))
    assert [delay(n, policy) for n in range(1, 7)] == [1.0, 5.0, 30.0, 30.0, 30.0, 30.0]
    assert [retry.tier_for(delay(n, policy) or 0, TIERS) for n in (1, 2, 3)] == [1.0, 5.0, 60.0]


async def test_a_retry_delay_the_handler_raises_wins_over_the_jobs_backoff_but_not_its_limit() -> (
    None
):
    consumer = Consumer("amqp://unused", group="g", retry_tiers=TIERS, report_events=False)

    @consumer.handler("orders.expire", max_attempts=4, backoff=handler_backoff)
    async def later(job: Job) -> None:
        raise Retry(delay=15.0)

    policy = {"max_attempts": 2, "retry_backoff": [1.0]}
    first = await run_handler(consumer, "orders.expire", make_job({}, **policy))
    assert (first.kind, first.delay_s) == ("retried", 15.0)
    last = await run_handler(consumer, "orders.expire", make_job({}, attempt=2, **policy))
    assert (last.kind, last.delay_s) == ("dead", None)


def test_policy_headers_round_trip() -> None:
    headers = contract.retry_policy_headers(max_attempts=3, backoff_s=[0.5, 2, 30.0, 0.0004])
    assert headers == {"x-retry-max-attempts": 3, "x-retry-backoff-s": "0.5,2,30,0"}
    assert contract.read_retry_policy(headers) == RetryPolicy(
        max_attempts=3, backoff_s=(0.5, 2.0, 30.0, 0.0)
    )
    assert contract.retry_policy_headers(max_attempts=None, backoff_s=None) == {}
    assert all(contract.is_reserved_header(name) for name in contract.RETRY_POLICY_HEADERS)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, RetryPolicy()),
        ({"x-retry-max-attempts": "4"}, RetryPolicy(max_attempts=4)),
        ({"x-retry-max-attempts": b"4"}, RetryPolicy(max_attempts=4)),
        ({"x-retry-max-attempts": 0}, RetryPolicy()),
        ({"x-retry-max-attempts": 101}, RetryPolicy()),
        ({"x-retry-max-attempts": True}, RetryPolicy()),
        ({"x-retry-max-attempts": "four"}, RetryPolicy()),
        ({"x-retry-backoff-s": b"1,2"}, RetryPolicy(backoff_s=(1.0, 2.0))),
        ({"x-retry-backoff-s": "1,soon"}, RetryPolicy()),
        ({"x-retry-backoff-s": "1,nan"}, RetryPolicy()),
        ({"x-retry-backoff-s": "-1"}, RetryPolicy()),
        ({"x-retry-backoff-s": "3601"}, RetryPolicy()),
        ({"x-retry-backoff-s": 5}, RetryPolicy()),
    ],
)
def test_an_unreadable_policy_value_counts_as_absent(
    headers: dict[str, object], expected: RetryPolicy
) -> None:
    assert contract.read_retry_policy(headers) == expected


def test_the_backoff_bound_is_the_longest_default_tier() -> None:
    assert max(retry.DEFAULT_TIERS) == contract.RETRY_BACKOFF_MAX_S


def test_policy_validation_names_what_is_wrong() -> None:
    assert validation.max_attempts_problem(1) is None
    assert validation.max_attempts_problem(100) is None
    assert validation.max_attempts_problem(0) == "must be between 1 and 100"
    assert validation.max_attempts_problem(2.0) == "must be an integer"
    assert validation.retry_backoff_problem([0, 3600]) is None
    assert validation.retry_backoff_problem([]) == ("", "must hold 1 to 100 delays")
    assert validation.retry_backoff_problem([1, float("inf")]) == (
        "[1]",
        "must be between 0 and 3600 seconds",
    )


def test_the_client_sends_the_policy_as_the_api_fields() -> None:
    body = job_body("orders.expire", {}, max_attempts=3, retry_backoff=[timedelta(seconds=2), 0.5])
    assert body == {
        "routing_key": "orders.expire",
        "payload": {},
        "max_attempts": 3,
        "retry_backoff_s": [2.0, 0.5],
    }
    assert "retry_backoff_s" not in job_body("orders.expire", {})
