"""Observes each request's latency per route template (``/v1/jobs/{job_id}``, never the raw path,
so job ids cannot grow the metric's label set), method and status."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from dispatcher.metrics import Metrics

UNMATCHED = "unmatched"  # 404s for paths no route knows, and requests refused before routing


class RequestLatency:
    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # unless a response starts

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, observed_send)
        finally:
            # The router records the matched route in the scope it was handed (this one).
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            observed = self._metrics.child(
                self._metrics.api_latency, route, scope["method"], str(status)
            )
            observed.observe(time.perf_counter() - started)
