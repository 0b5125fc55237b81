"""The cap on requests in progress: past it, a request is answered 503 before it costs more."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatcher.api import problems

Refused = Callable[[str], None]  # counts a refusal by its reason


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
