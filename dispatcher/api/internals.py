"""The uvicorn internals the HTTP edge relies on, fenced as ``amqp.frames.supported`` fences
aiormq's: the one release they were written and tested for, and start-up probes of what is used.

Two things reach past uvicorn's public API: ``connections.GuardedProtocol`` subclasses its
httptools protocol and overrides the parser's callbacks (the connection cap, header and body
deadlines, header bytes, answers sent in slices against the unsent budget), and the node's server
overrides ``Server.capture_signals`` (the node owns SIGTERM and SIGINT). A release may change
either without notice, and uvicorn's stock protocol has none of those guards, so there is no
fallback: ``pyproject.toml`` pins ``TESTED_UVICORN`` and a node asked to serve HTTP on any other
release, or where a probe misses what is overridden, refuses to start (``require``) and says why.
"""

from __future__ import annotations

import inspect
from importlib import metadata

import uvicorn
from uvicorn.protocols.http import httptools_impl

from dispatcher import errors

# The uvicorn release the HTTP edge's guards were written and tested for; pyproject.toml pins it.
TESTED_UVICORN = "0.54.0"
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


def _installed(version: str | None) -> str:
    return metadata.version("uvicorn") if version is None else version


def unsupported(*, uvicorn_version: str | None = None) -> str | None:
    """None when the guards can serve on the installed uvicorn (``uvicorn_version``: judge that
    version instead), else why they cannot, naming the installed and the supported release."""
    version = _installed(uvicorn_version)
    if version != TESTED_UVICORN:
        missing: str | None = (
            "its guards (connection caps, header, body and write deadlines, unsent budget) were "
            "written and tested for that release only"
        )
    else:
        missing = _protocol_missing() or _signals_missing()
    if missing is None:
        return None
    return (
        f"uvicorn {version} is installed and the HTTP edge supports uvicorn {TESTED_UVICORN}: "
        f"{missing}; install uvicorn=={TESTED_UVICORN} (pip install -c constraints.txt)"
    )


def require(*, uvicorn_version: str | None = None) -> None:
    """Raise ``errors.HttpServerUnsupported`` unless the guards can serve (``unsupported``)."""
    reason = unsupported(uvicorn_version=uvicorn_version)
    if reason is not None:
        raise errors.HttpServerUnsupported(f"the HTTP server cannot start: {reason}")


def _protocol_missing() -> str | None:
    """Why ``connections.GuardedProtocol`` could not subclass this uvicorn's protocol, if so."""
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


def _signals_missing() -> str | None:
    """Why overriding ``uvicorn.Server.capture_signals`` would not keep uvicorn off the
    signals, if so."""
    capture = getattr(uvicorn.Server, "capture_signals", None)
    if not callable(capture):
        return "uvicorn's Server has no capture_signals method"
    if "capture_signals" not in uvicorn.Server.serve.__code__.co_names:
        return "uvicorn's Server.serve does not take the signals through capture_signals"
    return None
