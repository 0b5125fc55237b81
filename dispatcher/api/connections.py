"""What a connection may cost the node while it sends a request and while it takes the answer.

``protocol_class`` makes uvicorn's httptools protocol (given as ``uvicorn.Config(http=...)``)
close one connection past ``max_connections``, or past its client's share of them
(``client_slots``), at accept, close a connection whose request headers do not arrive within
``header_timeout_s`` (counted from the connection, or from the previous response on a kept-alive
one) or exceed ``MAX_HEADER_BYTES`` (431), and close one whose body does not arrive within
``body_timeout_s`` of its headers: idle or trickling clients (slowloris) cannot hold the node's
connections (the requests in progress are capped apart: ``request_cap``). It
overrides uvicorn's internals: a node serves only on the release ``internals`` was tested with.

Answers: the app's ``send`` hands a body to the transport in ``SLICE_BYTES`` slices and waits
(uvicorn's flow control) while the transport holds more than ``HIGH_WATER_BYTES``, so a connection
buffers about two slices, not a whole answer; the rest waits in the app, charged with the buffer
to ``Limits.unsent`` (the budget every connection shares: see ``unsent``). A connection whose
socket takes no byte for ``write_timeout_s`` is closed (``write_timeout``); one whose answer
does not fit the budget gets 503 (or, mid-answer, is closed), and stalled ones closed to make room
for it are counted too (``write_budget``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import socket
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from dispatcher.api import client_slots, problems, unsent

logger = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024  # the request line and every header, together
SLICE_BYTES = 32 * 1024  # an answer reaches the transport this much at a time
HIGH_WATER_BYTES = 32 * 1024  # past this in the transport's buffer, the app's send waits
SHORT_BYTES = 64 * 1024  # an answer (or a streamed chunk) this short always goes out
STALLED_S = 1.0  # a connection that took nothing for this long may be closed to make room


Refused = Callable[[str], None]  # counts a refusal by its reason


def unsent_budget(budget_bytes: int, write_timeout_s: float) -> unsent.Unsent:
    """The budget a server's connections share. A short answer always goes out; a
    connection that took nothing for a second (or the write timeout, if shorter) may be closed to
    make room for a new answer."""
    stalled_s = min(STALLED_S, write_timeout_s)
    return unsent.Unsent(budget_bytes, free_bytes=SHORT_BYTES, stalled_s=stalled_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    max_connections: int
    clients: client_slots.ClientSlots  # the slots each client address holds, of max_connections
    header_timeout_s: float
    body_timeout_s: float
    write_timeout_s: float
    send_buffer_bytes: int  # the kernel's send buffer per connection; 0: its own autotuning
    unsent: unsent.Unsent  # shared by the server's connections
    refused: Refused  # where each closed connection is counted


class GuardedProtocol(HttpToolsProtocol):
    """One connection. Its read deadline is either the headers' (no request being read) or the
    body's (headers in, body not yet whole); none while the app answers. Its write deadline runs
    while it holds unsent bytes, from the last time its socket took some."""

    limits: ClassVar[Limits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._pending = 0  # bytes of the answer the app handed over, not yet in the transport
        self._closed_by_us = False  # and counted
        self._aborted = False
        self._lost = False
        self._written = 0  # answer bytes handed to the transport, ever
        self._taken_then: int | None = None  # what the client had acknowledged at the last look
        self._client: str | None = None  # the client its slot is counted for, once taken

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=HIGH_WATER_BYTES)
        if self.limits.send_buffer_bytes:
            # Autotuned, the kernel takes up to 4 MiB an answer from a client that never reads.
            self._set_option(socket.SO_SNDBUF, self.limits.send_buffer_bytes)
        if len(self.connections) > self.limits.max_connections:
            self._close("too_many_connections")
            return
        client = client_slots.client_of(transport.get_extra_info("peername"))
        if not self.limits.clients.take(client):
            self._close("too_many_connections_per_client")
            return
        self._client = client
        self._arm(self.limits.header_timeout_s, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._disarm()
        self._disarm_write()
        self.limits.unsent.release(self)
        if self._client is not None:
            self.limits.clients.give_back(self._client)
            self._client = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._closed_by_us:
            super().data_received(data)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._account()

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
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not previous:
            # run_asgi hands the app ``self.send``; its task has not run yet.
            self.cycle.send = cast(Any, self._answering(self.cycle))  # type: ignore[method-assign]

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

    def _answering(self, cycle: RequestResponseCycle) -> Send:
        """CYCLE's send, through the budget and in slices. The answer's start is held until its
        first body: if the budget cannot take that body, the answer becomes a 503."""
        send = cast(Send, cycle.send)
        start: Message | None = None

        async def guarded(message: Message) -> None:
            nonlocal start
            if self._closed_by_us:
                return  # refused or closed: what the app still sends goes nowhere
            if message["type"] == "http.response.start" and not cycle.response_started:
                start = message
            elif message["type"] == "http.response.body":
                held, start = start, None
                await self._send_body(cycle, send, held, message)
            else:
                await send(message)

        return guarded

    async def _send_body(
        self, cycle: RequestResponseCycle, send: Send, start: Message | None, message: Message
    ) -> None:
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        if len(body) <= SLICE_BYTES and not self._pending and not self.limits.unsent.holds(self):
            # Most answers: one slice on a connection that holds nothing, which always fits.
            if start is not None:
                await send(start)
            await send(message)
            self._written += len(body)
            if self.transport.get_write_buffer_size():
                self._account()
            return
        self._account()
        evicted = self.limits.unsent.admit(self, len(body), self.loop.time())
        if evicted is None:
            if start is None:
                self._abort("write_budget")  # mid-answer: nothing else can tell the client
                return
            self._count("write_budget")
            text = "the node holds too many unsent answers; retry later"
            scope, receive = cast(Scope, cycle.scope), cast(Receive, cycle.receive)
            retry = {"retry-after": "1"}
            await problems.refuse(scope, receive, send, 503, "busy", text, headers=retry)
            self._account()
            return
        for other in evicted:
            cast(GuardedProtocol, other)._abort("write_budget")
        self._pending += len(body)
        if start is not None:
            await send(start)
        view = memoryview(body)
        offset = 0
        while True:
            # A copy: a slice left in the transport's buffer must not pin the whole body.
            piece = bytes(view[offset : offset + SLICE_BYTES])
            offset += len(piece)
            last = offset >= len(body)
            # uvicorn's send waits first while the transport is past its high water.
            await send(
                {"type": "http.response.body", "body": piece, "more_body": more_body or not last}
            )
            self._pending -= len(piece)
            self._written += len(piece)
            if self._aborted or self._lost or cycle.disconnected:
                return
            self._account()
            if last:
                return

    def _account(self) -> None:
        """Measure what this connection holds unsent; keep a write deadline while it holds any."""
        if self._measure() > 0 and self._write_deadline is None:
            timeout_s = self.limits.write_timeout_s
            self._write_deadline = self.loop.call_later(timeout_s, self._check_progress)
            self._taken_then = self._taken()

    def _measure(self) -> int:
        if self._aborted or self._lost:
            return 0
        size = self._pending + self.transport.get_write_buffer_size()
        self.limits.unsent.update(self, size, self.loop.time())
        return size

    def _check_progress(self) -> None:
        self._write_deadline = None
        if self._measure() == 0:
            return
        # A slow client may take only part of what the kernel holds, which the node's own
        # buffer does not show until the kernel takes more from it.
        taken, self._taken_then = self._taken_then, self._taken()
        if taken is not None and self._taken_then is not None and self._taken_then > taken:
            self.limits.unsent.progressed(self, self.loop.time())
        progressed_at = self.limits.unsent.progressed_at(self)
        assert progressed_at is not None  # it holds bytes
        idle_s = self.loop.time() - progressed_at
        if idle_s >= self.limits.write_timeout_s:
            self._abort("write_timeout")
        else:
            left_s = self.limits.write_timeout_s - idle_s
            self._write_deadline = self.loop.call_later(left_s, self._check_progress)

    def _taken(self) -> int | None:
        """Answer bytes the client has acknowledged, give or take a constant (uvicorn writes the
        headers itself): written, less the transport's buffer and what the kernel holds unacked
        (Linux's SIOCOUTQ). It never grows without the client; None where unknown."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return None
        try:
            raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4)
        except OSError:
            return None
        queued = int(struct.unpack("i", raw)[0])
        return self._written - self.transport.get_write_buffer_size() - queued

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

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _count(self, reason: str) -> None:
        """Count this connection as refused, once."""
        if not self._closed_by_us:
            self._closed_by_us = True
            self.limits.refused(reason)

    def _close(self, reason: str) -> None:
        self._deadline = None
        self._disarm()
        if self._closed_by_us or self.transport.is_closing():
            return
        self._count(reason)
        # A request the app is still reading sees a disconnect and ends.
        self.transport.close()

    def _abort(self, reason: str) -> None:
        """Close now, dropping what is unsent (``close`` would wait for the client to take it)."""
        if self._aborted or self._lost:
            return
        self._aborted = True
        self._count(reason)
        self._disarm()
        self._disarm_write()
        self.limits.unsent.release(self)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # as connection_lost will: the app's sends return at once
            cycle.message_event.set()
        # A reset: the kernel drops what it still held for the client instead of retrying it.
        self._set_option(socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _set_option(self, option: int, value: int | bytes) -> None:
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, option, value)


def protocol_class(limits: Limits) -> type[GuardedProtocol]:
    """The protocol class for one server, bound to its limits (uvicorn instantiates it)."""
    bound = type("GuardedProtocol", (GuardedProtocol,), {"limits": limits})
    return cast(type[GuardedProtocol], bound)
