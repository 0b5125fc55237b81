"""Who may call what: FastAPI dependencies that resolve the bearer key to a Principal and check
its scope. 401 for a missing or invalid key, 403 for a missing scope; /healthz needs none."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dispatcher import errors, keys

if TYPE_CHECKING:
    from dispatcher.node import Node

logger = logging.getLogger(__name__)

# auto_error off: a missing key is ours to answer (in our error shape); the scheme also puts an
# "Authorize" button in /docs.
_bearer = HTTPBearer(auto_error=False, description="an API key (dispatcher keys create)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def principal(request: Request, credentials: Credentials) -> keys.Principal:
    """The caller, whatever its scope."""
    node: Node = request.app.state.node
    try:
        return await node.keyring.authenticate(credentials.credentials if credentials else None)
    except errors.Unauthenticated as exc:
        _refused(node, request, 401, str(exc))
        raise


def _requires(scope: keys.Scope) -> object:
    async def check(
        request: Request, caller: Annotated[keys.Principal, Depends(principal)]
    ) -> keys.Principal:
        if not caller.has(scope):
            message = f"this key's scope is {caller.scope}; this needs {scope}"
            _refused(request.app.state.node, request, 403, message)
            raise errors.Forbidden(message)
        return caller

    return Depends(check)


def _refused(node: Node, request: Request, status: int, reason: str) -> None:
    # The reason and the path only: the Authorization header is never logged.
    node.metrics.auth_refused.labels(status=str(status)).inc()
    logger.info(
        "refused %s %s (%d): %s",
        request.method,
        request.url.path,
        status,
        reason,
        extra={"action": "auth"},
    )


def check_routing_key(caller: keys.Principal, routing_key: str, field: str) -> None:
    """403 naming the field when the key may not publish to this routing key."""
    if not caller.may_route(routing_key):
        raise errors.Forbidden(
            f"this key may only use routing keys starting with "
            f"{' or '.join(repr(p) for p in caller.routing_key_prefixes)}",
            field=field,
        )


AnyKey = Annotated[keys.Principal, Depends(principal)]
Producer = Annotated[keys.Principal, _requires(keys.Scope.PRODUCER)]
Monitor = Annotated[keys.Principal, _requires(keys.Scope.MONITOR)]
Admin = Annotated[keys.Principal, _requires(keys.Scope.ADMIN)]
