"""BrowserGuard: a browser cannot be used against the API.

A page on another site may make a browser send a form (text/plain, urlencoded, multipart) to the
node without a CORS preflight, carrying nothing the page cannot forge; it can never send a JSON
content type or an Authorization header without one. So a write must carry a JSON body, or, when
it has no body, a JSON content type or a bearer key (415 otherwise). And with
``DISPATCHER_ALLOWED_HOSTS`` a request under a Host name the node does not serve (DNS rebinding)
is refused with 400; /healthz stays open to probes addressing the node by any name."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from dispatcher import hosts
from dispatcher.api import problems

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HOST_EXEMPT = frozenset({"/healthz"})


def is_json(content_type: bytes) -> bool:
    """``application/json``, with or without parameters (``; charset=utf-8``)."""
    media_type = content_type.split(b";", 1)[0].strip().lower()
    return media_type == b"application/json"


def has_body(headers: dict[bytes, bytes]) -> bool:
    declared = headers.get(b"content-length", b"").strip()
    return b"transfer-encoding" in headers or (declared != b"" and declared != b"0")


class BrowserGuard:
    def __init__(
        self, app: ASGIApp, *, allowed_hosts: list[hosts.Allowed], refused: Callable[[str], None]
    ) -> None:
        self._app = app
        self._allowed = allowed_hosts
        self._refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self._allowed and scope["path"] not in HOST_EXEMPT:
            host: str = headers.get(b"host", b"").decode("latin-1")
            if not hosts.is_allowed(host, self._allowed):
                self._refused("host")
                message = f"this node does not serve the host {host!r}"
                await problems.refuse(scope, receive, send, 400, "bad_host", message, field="host")
                return
        if scope["method"] in WRITES:
            problem = self._content_type_problem(headers)
            if problem is not None:
                self._refused("content_type")
                await problems.refuse(
                    scope, receive, send, 415, "unsupported_media_type", problem,
                    field="content-type",
                )  # fmt: skip
                return
        await self._app(scope, receive, send)

    @staticmethod
    def _content_type_problem(headers: dict[bytes, bytes]) -> str | None:
        content_type = headers.get(b"content-type")
        if content_type is not None and is_json(content_type):
            return None
        if has_body(headers):
            given = content_type.decode("latin-1") if content_type is not None else "none"
            return f"the body must be application/json, not {given}"
        if headers.get(b"authorization", b"")[:7].lower() == b"bearer ":
            return None  # a form cannot send this header
        return "a write without a body needs content-type application/json (or a bearer key)"
