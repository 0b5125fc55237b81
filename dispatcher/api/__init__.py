"""The HTTP API: ``create_api(deps)`` builds the FastAPI app (OpenAPI at /openapi.json, /docs,
/redoc) on what the routes use (``deps.ApiDeps``), which the node builds."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from dispatcher.api import jobs, lean, ops, problems, schedules
from dispatcher.api.browsers import BrowserGuard
from dispatcher.api.connections import RequestCap
from dispatcher.api.deps import ApiDeps
from dispatcher.api.gate import Gate, Rules, routes
from dispatcher.api.lean import LeanSubmit
from dispatcher.api.timing import Timing
from dispatcher.version import __version__

DOCS_ASSETS = "/docs-assets"


def create_api(deps: ApiDeps) -> FastAPI:
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
    rules = Rules(settings)
    # Outermost last: the browser guard, timing, the request cap, the gate (key, body bound), then
    # the lean path of POST /v1/jobs.
    app.add_middleware(LeanSubmit, deps=deps, route=_route(app, lean.PATH, "POST"))
    app.add_middleware(Gate, keyring=deps.keyring, metrics=deps.metrics, rules=rules)
    cap = settings.http_max_requests
    app.add_middleware(RequestCap, max_requests=cap, counted=rules.needs_key, refused=refused)
    app.add_middleware(Timing, histogram=deps.metrics.api_latency)
    app.add_middleware(BrowserGuard, allowed_hosts=settings.allowed_host_list(), refused=refused)
    return app


def _route(app: FastAPI, path: str, method: str) -> APIRoute:
    for route in routes(app.router.routes):
        if isinstance(route, APIRoute) and route.path == path and method in (route.methods or ()):
            return route
    raise LookupError(f"no route {method} {path}")
