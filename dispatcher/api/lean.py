"""The lean path of ``POST /v1/jobs``: a valid request served without FastAPI's router, dependency
solving and exception middleware, about a fifth of the node's time per request (py-spy).

It sits inside the gate, so the caller is authenticated and the body bounded already. It serves
only what it is sure of: a JSON body that validates as ``JobCreate``, from a caller the gate
admitted with the producer scope. Anything else (bad JSON, a field refused, another content
type) goes on to the FastAPI route, which answers exactly as it always did; the route also keeps
the OpenAPI document. Both call ``jobs.submit_one``, so what is stored and answered is the same.
"""

from __future__ import annotations

import json

from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatcher import errors
from dispatcher.api import auth, browsers, jobs, problems, schemas
from dispatcher.api.context import ApiContext
from dispatcher.auth import api_keys

PATH = jobs.router.prefix  # the route's own path: POST /v1/jobs


class LeanSubmit:
    def __init__(self, app: ASGIApp, *, context: ApiContext, route: APIRoute) -> None:
        self._app = app
        self._context = context
        self._route = route  # recorded in the scope, as the router does, for the latency metric

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        caller = _caller(scope)
        if caller is None:
            await self._app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:  # the gate has read and bounded the body: this replays it
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        whole = messages[-1]["type"] == "http.request"
        job = _valid(b"".join(m.get("body", b"") for m in messages)) if whole else None
        if job is None:

            async def replay() -> Message:
                return messages.pop(0) if messages else await receive()

            await self._app(scope, replay, send)
            return
        scope["route"] = self._route
        try:
            answer = await jobs.submit_one(job, self._context, caller)
        except errors.DispatcherError as exc:
            answer = problems.dispatcher_problem(exc)
        await answer(scope, receive, send)


def _caller(scope: Scope) -> api_keys.Principal | None:
    """The admitted producer of a JSON ``POST /v1/jobs``; None for any other request."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
        return None
    content_type = dict(scope["headers"]).get(b"content-type")
    if content_type is None or not browsers.is_json(content_type):
        return None
    caller = scope.get("state", {}).get(auth.PRINCIPAL)
    if isinstance(caller, api_keys.Principal) and caller.has(api_keys.Scope.PRODUCER):
        return caller
    return None


def _valid(body: bytes) -> schemas.JobCreate | None:
    """The request as the route would validate it (``json.loads``, then the model), or None for
    the route to refuse in its own words."""
    try:
        return schemas.JobCreate.model_validate(json.loads(body))
    except Exception:  # any refusal (JSON, depth, a field) is the route's to answer
        return None
