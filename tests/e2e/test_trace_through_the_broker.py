"""One trace from the producer's span to the handler's, through a real dispatcher and RabbitMQ;
and a consumer without OpenTelemetry handles a traced job as before."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumers_sdk import Consumer, DispatcherClient, Job
from consumers_sdk.enqueue import enqueue
from devstack.dispatcher_process import DispatcherProcess
from devstack.jobs_out import job, publish
from tests.support.consumers import running
from tests.support.queues import wait_for_consumer
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]
EXPORTER = InMemorySpanExporter()
ATTACHED: list[TracerProvider] = []


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """The finished spans of this test. The global provider can be set once per process: the
    first test sets it (or finds one), and the exporter is added to it once."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    if not ATTACHED:
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        ATTACHED.append(provider)
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


async def test_the_handler_span_continues_the_producer_span_through_the_dispatcher(
    dispatcher: DispatcherProcess, amqp_url: str, exporter: InMemorySpanExporter
) -> None:
    consumer = Consumer(amqp_url, group="traced", report_events=False)
    handled: list[tuple[Job, trace.SpanContext]] = []

    @consumer.handler("orders.traced")
    async def handle(job: Job) -> None:
        handled.append((job, trace.get_current_span().get_span_context()))

    tracer = trace.get_tracer("tests.producer")
    async with running(consumer), DispatcherClient(dispatcher.url) as client:
        with tracer.start_as_current_span("checkout") as producer:
            created = await client.schedule("orders.traced", {"order": 42})
        await eventually(lambda: len(handled) == 1, 30)

    origin = producer.get_span_context()
    traceparent = f"00-{origin.trace_id:032x}-{origin.span_id:016x}-{origin.trace_flags:02x}"
    [(job, inside)] = handled
    # Stored with the job and published unchanged by the dispatcher.
    assert created.headers["traceparent"] == traceparent
    assert (job.message.headers or {})["traceparent"] == traceparent
    [span] = [s for s in exporter.get_finished_spans() if s.kind is trace.SpanKind.CONSUMER]
    assert span.context is not None
    assert span.context.trace_id == origin.trace_id  # one trace
    assert span.parent is not None
    assert span.parent.span_id == origin.span_id  # whose parent is the producer's span
    assert inside.span_id == span.context.span_id  # and the handler ran inside it
    assert span.name == "process traced.orders.traced"
    assert span.attributes is not None
    assert span.attributes["messaging.system"] == "rabbitmq"
    assert span.attributes["messaging.message.id"] == created.id == job.id
    assert span.attributes["messaging.rabbitmq.destination.routing_key"] == "orders.traced"
    assert span.attributes["dispatcher.job.attempt"] == 1


async def test_a_job_enqueued_in_the_callers_transaction_carries_the_producer_span_too(
    dispatcher: DispatcherProcess, database_url: str, amqp_url: str, exporter: InMemorySpanExporter
) -> None:
    consumer = Consumer(amqp_url, group="traced", report_events=False)
    handled: list[Job] = []

    @consumer.handler("orders.enqueued")
    async def handle(job: Job) -> None:
        handled.append(job)

    tracer = trace.get_tracer("tests.producer")
    connection = await asyncpg.connect(database_url)
    try:
        async with running(consumer):
            with tracer.start_as_current_span("checkout") as producer:
                async with connection.transaction():
                    await enqueue(connection, "orders.enqueued", {"order": 7})
            await eventually(lambda: len(handled) == 1, 30)
    finally:
        await connection.close()

    origin = producer.get_span_context()
    [span] = [s for s in exporter.get_finished_spans() if s.kind is trace.SpanKind.CONSUMER]
    assert span.context is not None
    assert span.context.trace_id == origin.trace_id
    assert span.parent is not None
    assert span.parent.span_id == origin.span_id
    assert span.attributes is not None
    assert span.attributes["messaging.message.id"] == handled[0].id


NO_OTEL = """
import asyncio
import sys

sys.modules["opentelemetry"] = None  # any import of it raises ImportError

from consumers_sdk import Consumer, Job, tracing

assert not tracing.available()
consumer = Consumer(sys.argv[1], group="untraced", report_events=False)


@consumer.handler("orders.untraced")
async def handle(job: Job) -> None:
    print(sorted(job.headers), flush=True)
    consumer.stop()


asyncio.run(consumer.run(handle_signals=False))
"""


async def test_without_opentelemetry_a_traced_job_is_handled_as_before(amqp_url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        NO_OTEL,
        amqp_url,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await wait_for_consumer(amqp_url, "untraced.orders.untraced")
        traced = dataclasses.replace(
            job("orders.untraced", 1),
            headers={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
        )
        await publish(amqp_url, [traced])
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    assert out.decode().strip() == "['traceparent']"
