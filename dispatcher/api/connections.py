"""What a connection may cost the node before it has sent a whole request.

``protocol_class`` makes uvicorn's httptools protocol (given as ``uvicorn.Config(http=...)``)
close one connection past ``max_connections`` at accept, close a connection whose request headers
do not arrive within ``header_timeout_s`` (counted from the connection, or from the previous
response on a kept-alive one) or exceed ``MAX_HEADER_BYTES`` (431), and close one whose body does
not arrive within ``body_timeout_s`` of its headers: idle or trickling clients (slowloris) cannot
hold the node's connections. ``RequestCap`` answers 503 past ``max_requests`` requests in progress.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dispatcher.api import problems

MAX_HEADER_BYTES = 64 * 1024  # the request line and every header, together


Refused = Callable[[str], None]  # counts a refusal by its reason


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    max_connections: int
    header_timeout_s: float
    body_timeout_s: float
    refused: Refused  # where each closed connection is counted


class GuardedProtocol(HttpToolsProtocol):
    """One connection. Its deadline is either the headers' (no request being read) or the body's
    (headers in, body not yet whole); none while the app answers."""

    limits: ClassVar[Limits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._closed_by_us = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._close("too_many_connections")
            return
        self._arm(self.limits.header_timeout_s, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._closed_by_us:
            super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self._deadline is None:  # pipelined behind a request still being answered
            self._arm(self.limits.header_timeout_s, "header_timeout")

    def on_url(self, url: bytes) -> None:
        if self._within_header_bytes(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._within_header_bytes(len(name) + len(value)):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._closed_by_us:
            return
        self._arm(self.limits.body_timeout_s, "body_timeout")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._closed_by_us:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._closed_by_us:
            return
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            self._arm(self.limits.header_timeout_s, "header_timeout")

    def _within_header_bytes(self, size: int) -> bool:
        if self._closed_by_us:
            return False
        self._header_bytes += size
        if self._header_bytes <= MAX_HEADER_BYTES:
            return True
        message = f"the request line and headers exceed {MAX_HEADER_BYTES} bytes"
        body = json.dumps({"error": "headers_too_large", "message": message, "fields": []})
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body.encode())
        )
        self._close("headers_too_large")
        return False

    def _arm(self, delay_s: float, reason: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, self._close, reason)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _close(self, reason: str) -> None:
        self._deadline = None
        self._disarm()
        if self._closed_by_us or self.transport.is_closing():
            return
        self._closed_by_us = True
        self.limits.refused(reason)
        # A request the app is still reading sees a disconnect and ends.
        self.transport.close()


def protocol_class(limits: Limits) -> type[GuardedProtocol]:
    """The protocol class for one server, bound to its limits (uvicorn instantiates it)."""
    bound = type("GuardedProtocol", (GuardedProtocol,), {"limits": limits})
    return cast(type[GuardedProtocol], bound)


class RequestCap:
    """503 with Retry-After past ``max_requests`` requests in progress; requests ``counted``
    says no to (/healthz, the open routes) always pass, so probes see a busy node as alive.

    A request is in progress until its answer starts: a client slow to take its answer holds its
    connection (bounded by the write deadline and the unsent budget), not a place here."""

    def __init__(
        self, app: ASGIApp, *, max_requests: int, counted: Callable[[Scope], bool], refused: Refused
    ) -> None:
        self._app = app
        self._max_requests = max_requests
        self._counted = counted
        self._refused = refused
        self._in_progress = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._counted(scope):
            await self._app(scope, receive, send)
            return
        if self._in_progress >= self._max_requests:
            self._refused("too_many_requests")
            message = f"more than {self._max_requests} requests in progress; retry later"
            await problems.refuse(
                scope, receive, send, 503, "busy", message, headers={"retry-after": "1"}
            )
            return
        self._in_progress += 1
        done = False

        def finish() -> None:
            nonlocal done
            if not done:
                done = True
                self._in_progress -= 1

        async def send_started(message: Message) -> None:
            if message["type"] == "http.response.start":
                finish()
            await send(message)

        try:
            await self._app(scope, receive, send_started)
        finally:
            finish()
