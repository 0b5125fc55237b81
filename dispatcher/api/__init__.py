"""The HTTP API: ``create_api(deps)`` builds the node's ASGI app, the guards around the FastAPI app
(OpenAPI at /openapi.json, /docs, /redoc), on what the routes use (``deps.ApiDeps``), which the
node builds."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Receive, Scope, Send

from dispatcher.api import jobs, lean, ops, problems, schedules
from dispatcher.api.browsers import BrowserGuard
from dispatcher.api.deps import ApiDeps
from dispatcher.api.gate import Gate, Rules, routes
from dispatcher.api.latency import RequestLatency
from dispatcher.api.lean import LeanSubmit
from dispatcher.api.request_cap import RequestCap
from dispatcher.version import __version__

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


def create_api(deps: ApiDeps) -> Api:
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
    app.state.deps = deps
    problems.install(app)
    app.include_router(jobs.router)
    app.include_router(schedules.router)
    app.include_router(ops.router)
    # The console's static files hold no data (every figure comes from the API with a key), so
    # they are served without one. Shipped as package data: no build step.
    console = resources.files("dispatcher") / "console"
    app.mount("/console", StaticFiles(directory=str(console), html=True), name="console")
    settings = deps.settings
    refused = deps.metrics.refusal
    rules = Rules(settings, app.router)
    guarded: ASGIApp = LeanSubmit(app, deps=deps, route=_route(app, lean.PATH, "POST"))
    guarded = Gate(guarded, keyring=deps.keyring, metrics=deps.metrics, rules=rules)
    cap = settings.http_max_requests
    guarded = RequestCap(guarded, max_requests=cap, counted=rules.needs_key, refused=refused)
    guarded = RequestLatency(guarded, metrics=deps.metrics)
    guarded = BrowserGuard(
        guarded,
        allowed_hosts=settings.allowed_host_list(),
        refused=refused,
        auth_on=lambda: deps.keyring.enabled(),  # reached per request: building needs no keyring
    )
    return Api(app, guarded)


def _route(app: FastAPI, path: str, method: str) -> APIRoute:
    for route in routes(app.router.routes):
        if isinstance(route, APIRoute) and route.path == path and method in (route.methods or ()):
            return route
    raise LookupError(f"no route {method} {path}")
