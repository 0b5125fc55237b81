"""A job's whole life in one place: a dispatcher process fires jobs, an SDK consumer handles them
and reports each attempt, and ``GET /v1/jobs/{id}`` shows the history and the final state."""

from __future__ import annotations

import httpx
import pytest

from consumers_sdk import Consumer, Job
from devstack.dispatcher_process import DispatcherProcess
from tests.integration.test_consumer import TIERS, fixed, running
from tests.support.nodes import WRITE
from tests.support.waiting import job_when

pytestmark = pytest.mark.e2e


async def test_history_shows_every_attempt_and_the_final_state_and_a_dead_job_can_be_requeued(
    dispatcher: DispatcherProcess, amqp_url: str
) -> None:
    consumer = Consumer(amqp_url, group="billing", retry_tiers=TIERS, name="worker-1")
    tries: dict[int, int] = {}
    healed = False

    @consumer.handler("orders.expire", max_attempts=3, backoff=fixed(0.3))
    async def expire(job: Job) -> None:
        order = job.payload["order"]
        tries[order] = tries.get(order, 0) + 1
        if (order == 1 and tries[order] <= 2) or (order == 2 and not healed):
            raise RuntimeError(f"order {order} is locked")

    async with running(consumer), httpx.AsyncClient(base_url=dispatcher.url, headers=WRITE) as http:
        flaky, doomed = [
            (await http.post("/v1/jobs", json={"routing_key": "orders.expire", "payload": p}))
            .raise_for_status()
            .json()["id"]
            for p in ({"order": 1}, {"order": 2})
        ]
        done = await job_when(http, flaky, "succeeded")
        steps = [(s["event"], s.get("attempt")) for s in done["history"]]
        assert steps == [
            ("scheduled", None),
            ("dispatched", None),
            ("started", 1),
            ("failed", 1),
            ("started", 2),
            ("failed", 2),
            ("started", 3),
            ("succeeded", 3),
        ]
        assert done["history"][-1]["consumer"] == "worker-1"
        assert done["history"][3]["error"] == "RuntimeError: order 1 is locked"

        dead = await job_when(http, doomed, "dead")
        assert dead["last_error"] == "RuntimeError: order 2 is locked"
        assert [s["event"] for s in dead["history"]][-1] == "dead"
        listed = (
            await http.get("/v1/jobs", params={"state": "dead", "routing_key": "orders.expire"})
        ).json()["jobs"]
        assert [(j["id"], j["last_error"]) for j in listed] == [(doomed, dead["last_error"])]

        healed = True
        requeued = await http.post(f"/v1/jobs/{doomed}/requeue")
        assert requeued.status_code == 200, requeued.text
        again = await job_when(http, doomed, "succeeded")
        events = [s["event"] for s in again["history"]]
        # The requeue fired it again as a fresh delivery (attempts start over); both dispatches
        # stay in the history.
        assert events == [
            "scheduled",
            "dispatched",
            *["started", "failed"] * 2,
            "started",
            "dead",
            "requeued",
            "dispatched",
            "started",
            "succeeded",
        ]
        assert events.count("dead") == 1
        assert (await http.post(f"/v1/jobs/{doomed}/requeue")).status_code == 409
