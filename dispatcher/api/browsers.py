"""BrowserGuard: a browser cannot be used against the API.

A page on another site may make a browser send a form (text/plain, urlencoded, multipart) to the
node without a CORS preflight, carrying nothing the page cannot forge; it can never send a JSON
content type or an Authorization header without one. So a write must carry a JSON body, or, when
it has no body, a JSON content type or a bearer key (415 otherwise). And with
``DISPATCHER_ALLOWED_HOSTS`` a request under a Host name the node does not serve (DNS rebinding)
is refused with 400; /healthz stays open to probes addressing the node by any name. While the
node is open (no key: every caller is an admin) and that setting names nothing, only loopback
names are served (``hosts.LOOPBACK``): a rebound name gets nothing from an open node either.

Every answer carries framing headers: no other site may frame a page of the node (a console
framed by a hostile page could be made to click Requeue or Pause), and no answer is sniffed as
another type. The console and the API docs get a Content-Security-Policy that loads from the node
only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatcher import errors
from dispatcher.api import hosts, problems

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HOST_EXEMPT = frozenset({"/healthz"})
FRAMING = [(b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff")]
# The API answers JSON: nothing in it may load or frame anything.
API_POLICY = b"default-src 'none'; frame-ancestors 'none'"
# The console: its own script, style and API; a bar's width is set through the CSSOM (allowed).
CONSOLE_POLICY = (
    b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none';"
    b" form-action 'none'"
)
# Swagger UI and Redoc start from an inline script and style of their page, and Redoc renders in
# a worker made from a blob; everything they load is this node's (DOCS_ASSETS).
DOCS_POLICY = (
    b"default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline';"
    b" img-src 'self' data:; worker-src 'self' blob:; frame-ancestors 'none'; base-uri 'none'"
)


def policy_for(path: str) -> bytes:
    if path == "/console" or path.startswith("/console/"):
        return CONSOLE_POLICY
    if path in ("/docs", "/redoc") or path.startswith(("/docs/", "/docs-assets/")):
        return DOCS_POLICY
    return API_POLICY


def is_json(content_type: bytes) -> bool:
    """``application/json``, with or without parameters (``; charset=utf-8``)."""
    media_type = content_type.split(b";", 1)[0].strip().lower()
    return media_type == b"application/json"


def has_body(headers: dict[bytes, bytes]) -> bool:
    declared = headers.get(b"content-length", b"").strip()
    return b"transfer-encoding" in headers or (declared != b"" and declared != b"0")


class BrowserGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_hosts: list[hosts.Allowed],
        refused: Callable[[str], None],
        auth_on: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._app = app
        self._allowed = allowed_hosts
        self._refused = refused
        self._auth_on = auth_on  # None: always on (a test's app without a keyring)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        framed = [*FRAMING, (b"content-security-policy", policy_for(scope["path"]))]

        async def send_framed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *framed]
            await send(message)

        headers = dict(scope["headers"])
        if scope["path"] not in HOST_EXEMPT:
            allowed = self._allowed or await self._open_hosts()
            host: str = headers.get(b"host", b"").decode("latin-1")
            if allowed and not hosts.is_allowed(host, allowed):
                self._refused("host")
                message = f"this node does not serve the host {host!r}"
                if not self._allowed:
                    message += (
                        " (an open node answers loopback names only: set"
                        " DISPATCHER_ALLOWED_HOSTS, or create an API key)"
                    )
                await problems.refuse(
                    scope, receive, send_framed, 400, "bad_host", message, field="host"
                )
                return
        if scope["method"] in WRITES:
            problem = self._content_type_problem(headers)
            if problem is not None:
                self._refused("content_type")
                await problems.refuse(
                    scope, receive, send_framed, 415, "unsupported_media_type", problem,
                    field="content-type",
                )  # fmt: skip
                return
        await self._app(scope, receive, send_framed)

    async def _open_hosts(self) -> tuple[hosts.Allowed, ...]:
        """Loopback names while the node is open; none (any host) once auth is on, or while it
        cannot tell (PostgreSQL away before the keys were ever read: the gate answers 503)."""
        if self._auth_on is None:
            return ()
        try:
            return () if await self._auth_on() else hosts.LOOPBACK
        except errors.StoreUnavailable:
            return ()

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
