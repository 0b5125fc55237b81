"""/metrics: per routing key counters with bounded labels, scheduler gauges, consumers' outcomes
from their events, and API latency per route template; /v1/stats for the console and the CLI;
the publish path in /metrics and /readyz."""

from __future__ import annotations

from consumers_sdk import reporter
from tests.support.dispatched import dispatch_round
from tests.support.nodes import client, running_node
from tests.support.waiting import eventually


async def test_metrics_cover_jobs_per_routing_key_scheduler_outcomes_and_api_latency(
    database_url: str, amqp_url: str
) -> None:
    async with (
        running_node(
            database_url=database_url,
            amqp_url=amqp_url,
            shard_count=8,
            metrics_routing_keys=2,
            stats_interval_s=0.2,
        ) as node,
        client(node) as http,
    ):
        ids = []
        for key in ("a.one", "a.two", "a.three", "a.four"):
            job = {"routing_key": key, "payload": 1}
            ids.append((await http.post("/v1/jobs", json=job)).json()["id"])
        later = {"routing_key": "a.one", "payload": 2, "delay_ms": 3_600_000}
        cancelled = (await http.post("/v1/jobs", json=later)).json()["id"]
        assert (await http.delete(f"/v1/jobs/{cancelled}")).status_code == 200
        sample = node.core.metrics.registry.get_sample_value
        await eventually(lambda: sample("dispatcher_publish_confirms_total") == 4, 10)

        events = reporter.EventReporter(amqp_url, group="g", consumer="c")
        events.open()
        # As a consumer of that delivery reports: with its dispatch round.
        own = {
            "routing_key": "a.one",
            "dispatch_round": str(await dispatch_round(database_url, ids[0])),
        }
        events.report(job_id=ids[0], attempt=1, outcome="failed", error="x", **own)
        events.report(job_id=ids[0], attempt=2, outcome="succeeded", **own)
        await eventually(lambda: node.messaging.events.recorded == 2, 10)
        await events.close(5)
        await eventually(lambda: sample("dispatcher_scheduled_jobs") == 0, 5)
        # A stats round after the events were recorded has counted the final state (a fixed
        # wait for one round lost that race on a loaded machine).
        await eventually(lambda: sample("dispatcher_jobs", {"state": "succeeded"}) == 1, 10)
        text = (await http.get("/metrics")).text
        stats = (await http.get("/v1/stats")).json()
        console = await http.get("/console", follow_redirects=True)
        assert console.status_code == 200
        assert "<title>Delay dispatcher console</title>" in console.text

    for line in (
        'dispatcher_jobs_submitted_total{routing_key="a.one"} 2.0',
        "dispatcher_publish_framed 1.0",  # the installed aiormq is the tested one
        'dispatcher_jobs_submitted_total{routing_key="a.two"} 1.0',
        'dispatcher_jobs_submitted_total{routing_key="other"} 2.0',  # bounded: 2 keys, then other
        'dispatcher_jobs_dispatched_total{routing_key="other"} 2.0',
        'dispatcher_jobs_cancelled_total{routing_key="a.one"} 1.0',
        'dispatcher_consumer_outcomes_total{outcome="succeeded",routing_key="a.one"} 1.0',
        'dispatcher_consumer_outcomes_total{outcome="failed",routing_key="a.one"} 1.0',
        'dispatcher_jobs{state="succeeded"} 1.0',
        "dispatcher_scheduled_jobs 0.0",
        "dispatcher_shards_owned 8.0",
        "dispatcher_heap_size 0.0",
    ):
        assert line in text, line
    assert "dispatcher_window_horizon_seconds " in text
    assert "dispatcher_claims_fenced_early_total 0.0" in text  # this node's time is PostgreSQL's
    assert "dispatcher_clock_steps_total 0.0" in text
    [offset] = [line for line in text.splitlines() if line.startswith("dispatcher_clock_offset")]
    assert abs(float(offset.split()[-1])) < 0.05  # this host's clock is PostgreSQL's host's
    assert "dispatcher_fire_lateness_seconds_count 4.0" in text
    assert (
        'dispatcher_api_request_seconds_count{method="DELETE",route="/v1/jobs/{job_id}",'
        'status="200"} 1.0' in text
    )
    assert stats["by_state"]["dispatched"] == 3
    assert stats["by_state"]["succeeded"] == 1
    assert {"state": "cancelled", "routing_key": "a.one", "jobs": 1} in stats["counts"]
    assert stats["next_due"] == []


async def test_a_node_publishing_per_message_stays_ready_and_shows_the_path_and_why(
    database_url: str, amqp_url: str
) -> None:
    async with (
        running_node(
            database_url=database_url,
            amqp_url=amqp_url,
            shard_count=8,
            publish_path="per_message",
        ) as node,
        client(node) as http,
    ):
        job = {"routing_key": "path.each", "payload": 1}
        assert (await http.post("/v1/jobs", json=job)).status_code == 201
        sample = node.core.metrics.registry.get_sample_value
        await eventually(lambda: sample("dispatcher_publish_confirms_total") == 1, 10)
        ready = await http.get("/readyz")
        text = (await http.get("/metrics")).text
    assert ready.status_code == 200, ready.text
    assert ready.json()["publish_path"] == {
        "path": "per_message",
        "fallback_reason": "DISPATCHER_PUBLISH_PATH=per_message",
    }
    assert "dispatcher_publish_framed 0.0" in text
