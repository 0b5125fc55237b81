"""The HTTP API: ``create_api(node)`` builds the FastAPI app (OpenAPI at /openapi.json, /docs)."""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from dispatcher.api import jobs, ops, problems, schedules
from dispatcher.api.browsers import BrowserGuard
from dispatcher.api.connections import RequestCap
from dispatcher.api.gate import Gate, Rules
from dispatcher.api.timing import Timing

if TYPE_CHECKING:
    from dispatcher.node import Node


def create_api(node: Node) -> FastAPI:
    from dispatcher import __version__

    app = FastAPI(
        title="Delay dispatcher",
        version=__version__,
        description="Schedule jobs; each is published to RabbitMQ when it is due.",
    )
    app.state.node = node
    problems.install(app)
    app.include_router(jobs.router)
    app.include_router(schedules.router)
    app.include_router(ops.router)
    # The console's static files hold no data (every figure comes from the API with a key), so
    # they are served without one. Shipped as package data: no build step.
    console = resources.files("dispatcher") / "console"
    app.mount("/console", StaticFiles(directory=str(console), html=True), name="console")
    settings = node.settings
    refused = node.metrics.refusal
    rules = Rules(settings)
    # Outermost last: the browser guard, timing, the request cap, then the gate (key, body bound).
    app.add_middleware(Gate, node=node, rules=rules)
    cap = settings.http_max_requests
    app.add_middleware(RequestCap, max_requests=cap, counted=rules.needs_key, refused=refused)
    app.add_middleware(Timing, histogram=node.metrics.api_latency)
    app.add_middleware(BrowserGuard, allowed_hosts=settings.allowed_host_list(), refused=refused)
    return app
