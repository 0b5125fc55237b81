"""The uvicorn internals the HTTP edge relies on, fenced as ``amqp.frames.supported`` fences
aiormq's: the releases tested here, and start-up probes of what is used.

Two things reach past uvicorn's public API: ``connections.GuardedProtocol`` subclasses its
httptools protocol and overrides the parser's callbacks (header and body deadlines, header bytes,
answers sent in slices against the unsent budget), and the node's server overrides
``Server.capture_signals`` (the node owns SIGTERM and SIGINT). A release may change either without
notice, so each is used only when the installed release is in the tested range and the probe
finds what it overrides; otherwise the node logs why and serves with uvicorn's stock protocol,
or lets uvicorn take the signals while it serves (a signal it takes stops the node all the same).
"""

from __future__ import annotations

import inspect
from importlib import metadata

import uvicorn
from uvicorn.protocols.http import httptools_impl

# The uvicorn releases the HTTP edge's tests ran on, both ends included.
TESTED_UVICORN = ((0, 54, 0), (0, 54, 0))
# The protocol's methods GuardedProtocol overrides, and the request cycle's attributes it uses
# (set in its constructor, so read from its source's parameter names and assignments).
PROTOCOL_CALLBACKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "resume_writing",
    "on_message_begin",
    "on_url",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
)
CYCLE_ATTRIBUTES = (
    "send",
    "receive",
    "scope",
    "response_started",
    "response_complete",
    "disconnected",
    "message_event",
)


def _outside_tested(version: str) -> str | None:
    try:
        parsed = tuple(int(part) for part in version.split("."))
    except ValueError:
        parsed = None
    low, high = TESTED_UVICORN
    if parsed is not None and low <= parsed <= high:
        return None
    tested = ".".join(map(str, low)) + " to " + ".".join(map(str, high))
    return f"uvicorn {version} is outside the range tested ({tested})"


def _installed(version: str | None) -> str:
    return metadata.version("uvicorn") if version is None else version


def protocol_supported(*, uvicorn_version: str | None = None) -> str | None:
    """None when ``connections.GuardedProtocol`` can serve, else the reason it cannot."""
    outside = _outside_tested(_installed(uvicorn_version))
    if outside is not None:
        return outside
    protocol = getattr(httptools_impl, "HttpToolsProtocol", None)
    cycle = getattr(httptools_impl, "RequestResponseCycle", None)
    if not isinstance(protocol, type) or not isinstance(cycle, type):
        return "uvicorn has no HttpToolsProtocol or RequestResponseCycle"
    for name in PROTOCOL_CALLBACKS:
        if not callable(getattr(protocol, name, None)):
            return f"uvicorn's HttpToolsProtocol has no {name} method"
    try:
        source = inspect.getsource(cycle)
    except (OSError, TypeError):
        return "the source of uvicorn's RequestResponseCycle cannot be read"
    for name in CYCLE_ATTRIBUTES:
        if f"self.{name}" not in source and f"def {name}(" not in source:
            return f"uvicorn's RequestResponseCycle has no {name} attribute"
    return None


def signals_supported(*, uvicorn_version: str | None = None) -> str | None:
    """None when overriding ``uvicorn.Server.capture_signals`` keeps uvicorn off the signals,
    else the reason it would not."""
    outside = _outside_tested(_installed(uvicorn_version))
    if outside is not None:
        return outside
    capture = getattr(uvicorn.Server, "capture_signals", None)
    if not callable(capture):
        return "uvicorn's Server has no capture_signals method"
    if "capture_signals" not in uvicorn.Server.serve.__code__.co_names:
        return "uvicorn's Server.serve does not take the signals through capture_signals"
    return None
