"""Who may call what. The gate (``api.gate``) authenticates each request before its body is read
and leaves the Principal in the request's state, by the rule ``access.ROUTES`` gives the route;
these dependencies hand it to the routes and declare, on each route, the scope it needs (for an
app served without the gate, and the OpenAPI document). /healthz needs none."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dispatcher import errors
from dispatcher.api.context import ApiContext
from dispatcher.auth import api_keys

PRINCIPAL = "principal"  # the key of the admitted caller in the request's state

# auto_error off: a missing key is ours to answer (in our error shape); the scheme also puts an
# "Authorize" button in /docs.
_bearer = HTTPBearer(auto_error=False, description="an API key (dispatcher keys create)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def principal(request: Request, credentials: Credentials) -> api_keys.Principal:
    """The caller, whatever its scope: the one the gate admitted (looked up again only for an app
    served without the gate)."""
    admitted = request.scope.get("state", {}).get(PRINCIPAL)
    if isinstance(admitted, api_keys.Principal):
        return admitted
    context: ApiContext = request.app.state.context
    return await context.keyring.authenticate(credentials.credentials if credentials else None)


class ScopeCheck:
    """The dependency a route declares for the scope it needs (the same as its entry in
    ``access.ROUTES``: a test holds them equal)."""

    def __init__(self, scope: api_keys.Scope) -> None:
        self.scope = scope

    async def __call__(
        self, caller: Annotated[api_keys.Principal, Depends(principal)]
    ) -> api_keys.Principal:
        if not caller.has(self.scope):
            raise errors.Forbidden(denied(caller, self.scope))
        return caller


def denied(caller: api_keys.Principal, scope: api_keys.Scope) -> str:
    return f"this key's scope is {caller.scope}; this needs {scope}"


def check_routing_key(caller: api_keys.Principal, routing_key: str, field: str) -> None:
    """403 naming the field when the key may not publish to this routing key."""
    if not caller.may_route(routing_key):
        raise errors.Forbidden(
            f"this key may only use routing keys starting with "
            f"{' or '.join(repr(p) for p in caller.routing_key_prefixes)}",
            field=field,
        )


AnyKey = Annotated[api_keys.Principal, Depends(principal)]
Producer = Annotated[api_keys.Principal, Depends(ScopeCheck(api_keys.Scope.PRODUCER))]
Monitor = Annotated[api_keys.Principal, Depends(ScopeCheck(api_keys.Scope.MONITOR))]
Limits = Annotated[api_keys.Principal, Depends(ScopeCheck(api_keys.Scope.LIMITS))]
Admin = Annotated[api_keys.Principal, Depends(ScopeCheck(api_keys.Scope.ADMIN))]
