"""The consumer's Prometheus metrics against a real RabbitMQ: each outcome counted in a registry
the application owns, or served on a port while the consumer runs."""

from __future__ import annotations

import ipaddress
import socket

import httpx
import pytest
from prometheus_client import CollectorRegistry

from consumers_sdk import Consumer, Job, Reject, reporter
from consumers_sdk.metrics import ConsumerMetrics
from devstack.jobs_out import job, publish
from tests.support.consumers import running
from tests.support.waiting import eventually

GROUP = "billing"


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(f"dispatcher_consumer_{name}", {"group": GROUP, **labels})
    return value or 0.0


async def test_handled_failed_retried_dead_and_durations_are_counted_per_routing_key(
    amqp_url: str,
) -> None:
    registry = CollectorRegistry()
    consumer = Consumer(
        amqp_url,
        group=GROUP,
        retry_tiers=(0.3,),
        report_events=False,
        metrics=ConsumerMetrics(registry),
    )

    @consumer.handler("orders.ok")
    async def ok(job: Job) -> None:
        pass

    @consumer.handler("orders.flaky", max_attempts=2, backoff=lambda _: 0.3)
    async def flaky(job: Job) -> None:
        raise RuntimeError("downstream is down")

    @consumer.handler("orders.bad")
    def bad(job: Job) -> None:  # a sync handler is timed and counted the same way
        raise Reject("not an order")

    def value(name: str, key: str, **labels: str) -> float:
        return sample(registry, name, routing_key=key, **labels)

    async with running(consumer):
        await publish(
            amqp_url,
            [
                job("orders.ok", 1),
                job("orders.ok", 2),
                job("orders.flaky", 3),
                job("orders.bad", 4),
            ],
        )
        await eventually(
            lambda: (
                value("dead_total", "orders.flaky") == 1
                and value("dead_total", "orders.bad") == 1
                and value("handled_total", "orders.ok") == 2
            ),
            30,
        )
    assert value("failed_total", "orders.ok") == 0
    assert value("handled_total", "orders.flaky") == 0
    assert value("failed_total", "orders.flaky") == 2  # both attempts
    assert value("retried_total", "orders.flaky", tier="0.3") == 1  # only the first was retried
    assert value("failed_total", "orders.bad") == 1
    assert value("retried_total", "orders.bad", tier="0.3") == 0
    assert value("dead_total", "orders.ok") == 0
    assert value("handler_duration_seconds_count", "orders.ok") == 2
    assert value("handler_duration_seconds_count", "orders.flaky") == 2
    assert value("handler_duration_seconds_sum", "orders.bad") > 0


async def test_serve_metrics_serves_them_on_a_port_while_the_consumer_runs(amqp_url: str) -> None:
    consumer = Consumer(amqp_url, group=GROUP, report_events=False)
    handled: list[str] = []

    @consumer.handler("orders.ok")
    async def ok(job: Job) -> None:
        handled.append(job.id)

    consumer.serve_metrics(0, host="127.0.0.1")
    async with running(consumer), httpx.AsyncClient(timeout=10) as http:
        await publish(amqp_url, [job("orders.ok", 1)])
        await eventually(lambda: len(handled) == 1, 30)
        url = f"http://127.0.0.1:{consumer.metrics_port}/metrics"
        page = (await http.get(url)).text
    assert f'dispatcher_consumer_handled_total{{group="{GROUP}",routing_key="orders.ok"}} 1.0' in (
        page
    )
    async with httpx.AsyncClient(timeout=5) as http:
        with pytest.raises(httpx.ConnectError):  # no longer served once run() returned
            await http.get(url)


def this_hosts_address() -> str:
    """This machine's address on its route out: where a Prometheus on another host connects."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as route:
        route.connect(("192.0.2.1", 9))  # UDP: picks the route and its source, sends nothing
        address: str = route.getsockname()[0]
    assert not ipaddress.ip_address(address).is_loopback, address
    return address


async def test_the_metrics_page_is_served_on_this_machine_only_unless_widened(
    amqp_url: str,
) -> None:
    outside = this_hosts_address()
    consumers = []
    for host in (None, "0.0.0.0"):
        consumer = Consumer(amqp_url, group=GROUP, report_events=False)

        @consumer.handler("orders.ok")
        async def ok(job: Job) -> None:
            pass

        if host is None:
            consumer.serve_metrics(0)  # the default
        else:
            consumer.serve_metrics(0, host=host)
        consumers.append(consumer)
    default, widened = consumers
    async with (
        running(default),
        running(widened),
        httpx.AsyncClient(timeout=5, trust_env=False) as http,
    ):
        local = await http.get(f"http://127.0.0.1:{default.metrics_port}/metrics")
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://{outside}:{default.metrics_port}/metrics")
        remote = await http.get(f"http://{outside}:{widened.metrics_port}/metrics")
    assert local.status_code == 200
    assert remote.status_code == 200
    assert "dispatcher_consumer_handled_total" in remote.text


def test_events_dropped_by_the_reporter_are_counted() -> None:
    registry = CollectorRegistry()
    metrics = ConsumerMetrics(registry)
    events = reporter.EventReporter("amqp://unused", group=GROUP, consumer="c1", capacity=1)
    metrics.watch(events)
    for attempt in (1, 2, 3):  # never opened: the buffer only fills
        events.report(job_id="j", routing_key="orders.ok", attempt=attempt, outcome="started")
    assert (
        registry.get_sample_value("dispatcher_consumer_events_dropped_total", {"group": GROUP}) == 2
    )
