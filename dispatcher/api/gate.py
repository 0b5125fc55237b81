"""The gate: authenticates a request and bounds its body before a byte of the body is read.

FastAPI reads and decodes a body before a route's dependencies run, so without the gate an
anonymous client could make the node buffer and parse megabytes on the loop that fires jobs.
The gate finds the request's route in one table (``access.ROUTES``: the key, scope and body each
route asks for), looks the bearer key up, and answers 401, 403 or 429 at once, closing the
connection. An admitted caller's Principal rides in the request's state (``auth.PRINCIPAL``): the
route does not look the key up again. Then the body is read up to the route's bound (413 naming
it, from Content-Length up front or while a chunked body streams)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatcher import errors
from dispatcher.api import access, auth, problems
from dispatcher.auth import api_keys

if TYPE_CHECKING:
    from dispatcher.auth.keyring import Keyring
    from dispatcher.metrics import Metrics
    from dispatcher.settings import Settings

logger = logging.getLogger(__name__)

RULE = "dispatcher.rule"  # where a request's rule is kept in its scope
SMALL_BODY_BYTES = 1024  # routes that take no document: a path and a key are all they need
# A document's text may take up to 4 times its compact JSON (\u escapes), which is what the
# payload limit counts; the rest is room for the job's other fields.
ESCAPES = 4
DOCUMENT_SLACK_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Rule:
    """What a route asks of a request before its body is read: its access, bounded in bytes."""

    needs_key: bool
    scope: api_keys.Scope | None  # None: any valid key will do
    max_body_bytes: int


def document_bytes(settings: Settings) -> int:
    """The largest body one job (or one schedule) may legitimately take."""
    headers = settings.max_headers * settings.max_header_bytes
    return ESCAPES * (settings.max_payload_bytes + headers) + DOCUMENT_SLACK_BYTES


class Rules:
    """Each request's rule, from its route's entry in ``access.ROUTES``."""

    def __init__(self, settings: Settings, table: access.Table | None = None) -> None:
        self._table = access.Table() if table is None else table
        ceiling = settings.max_body_bytes
        self._bounds = {
            access.Body.SMALL: min(SMALL_BODY_BYTES, ceiling),
            access.Body.DOCUMENT: min(document_bytes(settings), ceiling),
            access.Body.BATCH: min(settings.max_batch * document_bytes(settings), ceiling),
        }
        # The rule of each (method, path) that is an entry's own (no path parameters): as many
        # entries as such routes, so a client cannot grow it; matching walks the table.
        self._by_path: dict[tuple[str, str], Rule] = {}

    def rule(self, scope: Scope) -> Rule:
        """The rule of the route the request goes to; unknown paths need no key (the router
        answers 404) and take a small body. Found once per request (the request cap asks too)."""
        found = scope.get(RULE)
        if isinstance(found, Rule):
            return found
        key = (scope["method"], scope["path"])
        found = self._by_path.get(key)
        if found is None:
            match = self._table.find(*key)
            granted = match.access
            found = Rule(granted.needs_key, granted.scope, self._bounds[granted.body])
            if match.fixed:
                self._by_path[key] = found
        scope[RULE] = found
        return found

    def paths_kept(self) -> int:
        """How many (method, path) pairs have their rule kept."""
        return len(self._by_path)

    def needs_key(self, scope: Scope) -> bool:
        return self.rule(scope).needs_key


class Gate:
    def __init__(self, app: ASGIApp, *, keyring: Keyring, metrics: Metrics, rules: Rules) -> None:
        self._app = app
        self._keyring = keyring
        self._metrics = metrics
        self._rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        rule = self._rules.rule(scope)
        if rule.needs_key and not await self._admit(scope, receive, send, rule):
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > rule.max_body_bytes:
            await self._too_large(scope, receive, send, rule.max_body_bytes)
            return
        messages: list[Message] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone (or closed at its body deadline): nobody to answer
            messages.append(message)
            received += len(message.get("body", b""))
            if received > rule.max_body_bytes:
                await self._too_large(scope, receive, send, rule.max_body_bytes)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self._app(scope, replay, send)

    async def _admit(self, scope: Scope, receive: Receive, send: Send, rule: Rule) -> bool:
        try:
            caller = await self._keyring.authenticate(bearer(scope))
        except errors.Unauthenticated as exc:
            await self._refuse_auth(scope, receive, send, 401, "unauthenticated", str(exc))
            return False
        except errors.StoreUnavailable:
            message = "the job store is unavailable; retry later"
            await problems.refuse(scope, receive, send, 503, "unavailable", message)
            return False
        if rule.scope is not None and not caller.has(rule.scope):
            message = auth.denied(caller, rule.scope)
            await self._refuse_auth(scope, receive, send, 403, "forbidden", message)
            return False
        scope.setdefault("state", {})[auth.PRINCIPAL] = caller
        return True

    async def _refuse_auth(
        self, scope: Scope, receive: Receive, send: Send, status: int, error: str, message: str
    ) -> None:
        # The reason and the path only: the Authorization header is never logged.
        self._metrics.auth_refused.labels(status=str(status)).inc()
        self._metrics.refusal(error)
        logger.info(
            "refused %s %s (%d): %s",
            scope["method"],
            scope["path"],
            status,
            message,
            extra={"action": "auth"},
        )
        challenge = {"www-authenticate": "Bearer"} if status == 401 else None
        await problems.refuse(scope, receive, send, status, error, message, headers=challenge)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        self._metrics.refusal("body_too_large")
        message = f"the request body exceeds {limit} bytes, this route's limit"
        await problems.refuse(scope, receive, send, 413, "body_too_large", message, field="body")


def bearer(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None
