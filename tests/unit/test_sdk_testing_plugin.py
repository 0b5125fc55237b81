"""The SDK's pytest plugin as a project that tests its handlers meets it: fixtures present with
nothing imported or configured, the documented example passing, and pytest left out of
``import consumers_sdk``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]

USER_CONSUMER = """
from consumers_sdk import Consumer, Job, Reject

consumer = Consumer("amqp://guest:guest@127.0.0.1:5672/", group="shop")


@consumer.handler("orders.paid", max_attempts=3)
async def paid(job: Job) -> None:
    if job.payload["amount"] <= 0:
        raise Reject("amount must be positive")
"""

USER_TESTS = """
from shop_consumers import consumer


async def test_a_paid_order_is_acked(dispatcher_job, run_handler):
    outcome = await run_handler(consumer, "orders.paid", dispatcher_job({"amount": 10}))
    assert outcome.kind == "acked"


async def test_a_negative_amount_is_dead_at_once(dispatcher_job, run_handler):
    outcome = await run_handler(consumer, "orders.paid", dispatcher_job({"amount": -1}))
    assert (outcome.kind, outcome.reason) == ("dead", "Reject: amount must be positive")


async def test_placing_an_order_schedules_its_expiry(recording_client):
    from datetime import timedelta

    job = await recording_client.schedule(
        "orders.expire", {"order": 7}, delay=timedelta(minutes=30), idempotency_key="order-7"
    )
    again = await recording_client.schedule(
        "orders.expire", {"order": 7}, delay=30 * 60, idempotency_key="order-7"
    )
    assert again.id == job.id
    assert [(j.routing_key, j.payload) for j in recording_client.scheduled] == [
        ("orders.expire", {"order": 7})
    ]
    await recording_client.cancel(job.id)
    assert (await recording_client.get(job.id)).state == "cancelled"
"""


def test_a_project_gets_the_fixtures_from_the_installed_sdk(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shop_consumers=USER_CONSUMER, test_shop=USER_TESTS)
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = error\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_the_documented_example_test_passes(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "-p", "no:cacheprovider", str(ROOT / "examples" / "test_consumer.py")
    )
    result.assert_outcomes(passed=3)


def test_importing_the_sdk_and_its_helpers_leaves_pytest_out() -> None:
    script = "import sys, consumers_sdk, consumers_sdk.testing; print('pytest' in sys.modules)"
    ran = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert (ran.returncode, ran.stdout.strip()) == (0, "False"), ran.stderr
