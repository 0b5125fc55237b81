"""The HTTP API: ``create_api(context)`` builds the node's ASGI app, the guards around the
FastAPI app (OpenAPI at /openapi.json, /docs, /redoc), on what the routes use
(``context.ApiContext``), which the node builds."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from importlib import resources

import fastapi
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from dispatcher.api import bulk_actions, jobs, lean, limits, ops, problems, schedules
from dispatcher.api.browsers import BrowserGuard
from dispatcher.api.context import ApiContext
from dispatcher.api.gate import Gate, Rules
from dispatcher.api.latency import RequestLatency
from dispatcher.api.lean import LeanSubmit
from dispatcher.api.request_cap import RequestCap
from dispatcher.version import __version__

logger = logging.getLogger(__name__)
DOCS_ASSETS = "/docs-assets"


class Api:
    """The node's ASGI app: the guards every request passes (outermost first: the browser guard,
    the latency observer, the request cap, the gate (key, body bound), then the lean path of
    ``POST /v1/jobs``), around the FastAPI app (``fastapi``: its routes, OpenAPI document and
    error handlers).

    The guards wrap FastAPI rather than sit inside its middleware stack so that a request the
    lean path serves passes no layer of FastAPI's or Starlette's own (telemetry, error and body
    limit middleware): about a twentieth of the node's CPU per request. An exception a guard did
    not expect is answered 500 by uvicorn as Starlette's error middleware did (plain text), and
    logged with its traceback."""

    def __init__(self, fastapi: FastAPI, guarded: ASGIApp) -> None:
        self.fastapi = fastapi
        self._guarded = guarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._guarded(scope, receive, send)


def build_fastapi() -> FastAPI:
    """The FastAPI app: its routes (each with its entry in ``access.ROUTES``), OpenAPI document,
    error handlers and static files; what it serves with is set on ``app.state.context``."""
    # /docs and /redoc load their JS and CSS from DOCS_ASSETS on this node, not from a CDN, so
    # they work on a machine without internet. The validator badge would send the spec's address
    # to a public service: off.
    app = FastAPIOffline(
        title="Delay dispatcher",
        version=__version__,
        description="Schedule jobs; each is published to RabbitMQ when it is due.",
        static_url=DOCS_ASSETS,
        swagger_ui_parameters={"validatorUrl": None},
    )
    problems.install(app)
    app.include_router(jobs.router)
    app.include_router(schedules.router)
    app.include_router(limits.router)
    app.include_router(bulk_actions.router)
    app.include_router(ops.router)
    # The console's static files hold no data (every figure comes from the API with a key), so
    # they are served without one. Shipped as package data: no build step.
    console = resources.files("dispatcher") / "console"
    app.mount("/console", StaticFiles(directory=str(console), html=True), name="console")
    return app


def create_api(context: ApiContext) -> Api:
    app = build_fastapi()
    app.state.context = context
    settings = context.settings
    refused = context.metrics.refusal
    rules = Rules(settings)
    guarded: ASGIApp = app
    route = _route(app, lean.PATH, "POST")
    if route is None:
        logger.warning(
            "POST %s is served by FastAPI alone: its route is not where this version of FastAPI "
            "(%s) was expected to keep it",
            lean.PATH,
            fastapi.__version__,
            extra={"action": "start"},
        )
    else:
        guarded = LeanSubmit(guarded, context=context, route=route)
    guarded = Gate(guarded, keyring=context.keyring, metrics=context.metrics, rules=rules)
    cap = settings.http_max_requests
    guarded = RequestCap(guarded, max_requests=cap, counted=rules.needs_key, refused=refused)
    guarded = RequestLatency(guarded, metrics=context.metrics)
    guarded = BrowserGuard(
        guarded,
        allowed_hosts=settings.allowed_host_list(),
        refused=refused,
        auth_on=lambda: context.keyring.enabled(),  # reached per request: building needs no keyring
    )
    return Api(app, guarded)


def routes(found: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes themselves: newer FastAPI versions wrap each included router in a route of its
    own (``original_router``). Our routers carry their prefix, so their routes' paths are whole."""
    for route in found:
        inner = getattr(route, "original_router", None)
        if inner is None:
            yield route
        else:
            yield from routes(inner.routes)


def _route(app: FastAPI, path: str, method: str) -> APIRoute | None:
    """The route the lean path records as the router would (the latency metric's label); None
    where a FastAPI release keeps its routes otherwise: then the route serves alone."""
    for route in routes(app.router.routes):
        if isinstance(route, APIRoute) and route.path == path and method in (route.methods or ()):
            return route
    return None
