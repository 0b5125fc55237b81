"""W3C trace context across the broker, with OpenTelemetry when it is installed (the ``otel``
extra: ``pip install 'delay-dispatcher-sdk[otel]'``); without it every function here changes
nothing.

The context rides in the job's own headers, ``traceparent`` and ``tracestate`` (W3C Trace
Context): the producer's current span goes in at submit (``inject``, called by the client and
``enqueue``), the dispatcher stores and publishes them as they are (they are producer headers, not
reserved names), and the consumer runs each handler in a span whose parent is that context
(``handler_span``). A header the producer set itself is never replaced.

OpenTelemetry is imported on first use, not with the SDK: its propagators are looked up among
the installed packages' entry points, a cost a command line should not pay at start.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from consumers_sdk import contract

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from consumers_sdk.job import Job

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
TRACE_HEADERS: Final = (TRACEPARENT, TRACESTATE)
TRACER_NAME: Final = "consumers_sdk"


@functools.cache
def available() -> bool:
    """True when OpenTelemetry's API can be imported (the ``otel`` extra)."""
    try:
        import opentelemetry.propagate
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def inject(
    headers: Mapping[str, contract.HeaderValue] | None,
) -> Mapping[str, contract.HeaderValue] | None:
    """``headers`` plus the current span's ``traceparent``/``tracestate``; ``headers`` itself
    when there is no OpenTelemetry, no current span, or the producer gave a ``traceparent``."""
    if not available() or (headers and any(name.lower() == TRACEPARENT for name in headers)):
        return headers
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    found = {name: carrier[name] for name in TRACE_HEADERS if carrier.get(name)}
    if TRACEPARENT not in found:  # no valid span context: nothing to continue
        return headers
    return {**(headers or {}), **found}


def extract(headers: Mapping[str, object]) -> Context | None:
    """The context a delivery's headers carry (None without OpenTelemetry); AMQP may hand the
    values over as bytes."""
    if not available():
        return None
    from opentelemetry import propagate

    carrier = {
        name.lower(): value.decode("latin-1") if isinstance(value, bytes) else str(value)
        for name, value in headers.items()
        if name.lower() in TRACE_HEADERS
    }
    return propagate.extract(carrier)


class HandlerSpan:
    """The span a handler runs in; ``ended`` records what its attempt came to."""

    def __init__(self, span: Span | None) -> None:
        self._span = span

    def ended(self, error: BaseException | None) -> None:
        """Mark the span failed with ``error`` (a handler's exception, or its timeout): the
        consumer catches the error to retry or park the job, so it never leaves the span."""
        if self._span is None or error is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self._span.record_exception(error)
        self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


@contextmanager
def handler_span(job: Job, *, queue: str) -> Iterator[HandlerSpan]:
    """Run a handler inside a consumer span continuing the producer's trace; without
    OpenTelemetry, a span that records nothing."""
    if not available():
        yield HandlerSpan(None)
        return
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        # No tracer provider set (yet): the span would be a no-op, at a cost per delivery.
        yield HandlerSpan(None)
        return
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"process {queue}",
        context=extract(job.message.headers or {}),
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.destination.name": queue,
            "messaging.rabbitmq.destination.routing_key": job.routing_key,
            "messaging.message.id": job.id,
            "dispatcher.job.attempt": job.attempt,
        },
    ) as span:
        yield HandlerSpan(span)
