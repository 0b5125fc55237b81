import random
from datetime import UTC, datetime, timedelta

import pytest

from consumers_sdk import topology
from consumers_sdk.client import job_body
from consumers_sdk.job import attempt_of
from consumers_sdk.retry import exponential, tier_for, validate_tiers


def test_exponential_backoff_grows_is_jittered_and_capped() -> None:
    backoff = exponential(base=15, cap=3600, rng=random.Random(1))
    for attempt in range(1, 6):
        delay = backoff(attempt)
        assert attempt**4 + 15 <= delay <= attempt**4 + 15 + 30 * (attempt + 1)
    assert backoff(50) == 3600
    other = exponential(rng=random.Random(2))
    assert backoff(3) != other(3), "two consumers do not retry in lockstep"


def test_a_delay_rounds_up_to_the_next_tier() -> None:
    tiers = validate_tiers([5, 1, 60, 15])
    assert tiers == (1, 5, 15, 60)
    assert tier_for(0.2, tiers) == 1
    assert tier_for(5, tiers) == 5
    assert tier_for(5.01, tiers) == 15
    assert tier_for(10_000, tiers) == 60


@pytest.mark.parametrize("tiers", [[], [0], [-1, 5], [float("inf")]])
def test_invalid_tiers_are_refused(tiers: list[float]) -> None:
    with pytest.raises(ValueError, match="retry_tiers"):
        validate_tiers(tiers)


def test_queue_names_and_arguments() -> None:
    work = topology.work_queue("billing", "orders.expire")
    assert work == "billing.orders.expire"
    assert topology.wait_queue(work, 0.25) == "billing.orders.expire.retry.250ms"
    assert topology.wait_queue(work, 60) == "billing.orders.expire.retry.60s"
    assert topology.dead_queue(work) == "billing.orders.expire.dead"
    quorum = topology.wait_arguments(work, 1.5, "quorum")
    assert quorum["x-message-ttl"] == 1500
    assert quorum["x-dead-letter-routing-key"] == work
    assert quorum["x-dead-letter-strategy"] == "at-least-once"
    assert quorum["x-overflow"] == "reject-publish"
    assert "x-dead-letter-strategy" not in topology.wait_arguments(work, 1.5, "classic")
    assert topology.work_arguments(work, "quorum")["x-dead-letter-routing-key"] == f"{work}.dead"


def test_attempt_counts_retries_from_x_death() -> None:
    work = "g.rk"
    assert attempt_of({}, work) == 1
    deaths = [
        {"queue": f"{work}.retry.1s", "reason": "expired", "count": 2},
        {"queue": f"{work}.retry.5s", "reason": "expired", "count": 1},
        {"queue": "elsewhere", "reason": "expired", "count": 7},
    ]
    assert attempt_of({"x-death": deaths}, work) == 4
    assert attempt_of({"x-retry-attempt": 6}, work) == 6


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


def test_a_timeout_above_the_brokers_consumer_timeout_is_refused() -> None:
    from consumers_sdk import Consumer

    consumer = Consumer("amqp://x", group="g")
    with pytest.raises(ValueError, match="consumer timeout"):
        consumer.handler("a", timeout=3600)
