"""Trace context in a job's headers: taken from the current OpenTelemetry span at submit, read
back at delivery; and nothing at all without OpenTelemetry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from consumers_sdk import client, tracing

ROOT = Path(__file__).parents[2]
TRACER = TracerProvider().get_tracer("tests")


def test_without_a_current_span_the_headers_are_left_alone() -> None:
    given = {"tenant": "t1"}
    assert tracing.inject(given) is given
    assert tracing.inject(None) is None
    assert "headers" not in client.job_body("orders.expire", 1)


def test_the_current_span_goes_into_the_jobs_headers() -> None:
    with TRACER.start_as_current_span("checkout") as span:
        body = client.job_body("orders.expire", 1, headers={"tenant": "t1"})
    context = span.get_span_context()
    ids = f"{context.trace_id:032x}-{context.span_id:016x}"
    assert body["headers"] == {"tenant": "t1", "traceparent": f"00-{ids}-{context.trace_flags:02x}"}


def test_a_traceparent_the_producer_gave_is_kept() -> None:
    own = {"TraceParent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with TRACER.start_as_current_span("checkout"):
        assert tracing.inject(own) is own


def test_the_producers_context_is_read_back_from_text_or_bytes() -> None:
    with TRACER.start_as_current_span("checkout") as span:
        headers = tracing.inject({})
    assert headers is not None
    for value in (headers["traceparent"], str(headers["traceparent"]).encode()):
        extracted = tracing.extract({"traceparent": value, "tenant": "t1"})
        parent = trace.get_current_span(extracted).get_span_context()
        assert (parent.trace_id, parent.span_id) == (
            span.get_span_context().trace_id,
            span.get_span_context().span_id,
        )
        assert parent.is_remote


def test_a_failed_attempt_marks_the_handler_span_failed_and_a_handled_one_does_not() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("process failed") as span:
        tracing.HandlerSpan(span).ended(ValueError("no such order"))
    with tracer.start_as_current_span("process handled") as span:
        tracing.HandlerSpan(span).ended(None)
    failed, handled = exporter.get_finished_spans()
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ValueError: no such order"
    assert [event.name for event in failed.events] == ["exception"]
    assert handled.status.status_code is StatusCode.UNSET
    assert not handled.events


NO_OTEL = """
import sys
sys.modules["opentelemetry"] = None  # any import of it raises ImportError
from consumers_sdk import client, tracing
assert not tracing.available()
assert client.job_body("k", 1, headers={"tenant": "t1"})["headers"] == {"tenant": "t1"}
assert "headers" not in client.job_body("k", 1)
assert tracing.extract({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
ran = []
with tracing.handler_span(None, queue="q"):  # no span: the job is not even looked at
    ran.append(True)
assert ran == [True]
print("unchanged")
"""


def test_without_opentelemetry_nothing_is_added_and_handlers_run_as_before() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_OTEL], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "unchanged"
