"""The node's HTTP server: uvicorn as the API's guards need it, configured from Settings.

The guards live in ``connections`` (connection and client shares, deadlines, the unsent budget);
this module puts them together with the ASGI app into one server, which never takes the signals
(the node owns SIGTERM and SIGINT) and answers ``stop`` by finishing the requests in flight.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp

from dispatcher import metrics
from dispatcher.api import client_slots, connections, internals
from dispatcher.settings import Settings


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the node owns the signals. Overrides a method
    uvicorn's ``serve`` calls, which ``internals.require`` checks before a node serves."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


class HttpServer:
    def __init__(self, settings: Settings, app: ASGIApp, node_metrics: metrics.Metrics) -> None:
        self._settings = settings
        self._app = app
        self._metrics = node_metrics
        self._server: uvicorn.Server | None = None

    @staticmethod
    def require() -> None:
        """``errors.HttpServerUnsupported`` unless the installed uvicorn is the one the guards
        were written for (``internals``): checked before any service is touched."""
        internals.require()

    def config(self) -> uvicorn.Config:
        settings = self._settings
        unsent = connections.unsent_budget(
            settings.http_max_unsent_bytes, settings.http_write_timeout_s
        )
        self._metrics.http_unsent_bytes.set_function(lambda: unsent.total_bytes)
        limits = connections.Limits(
            max_connections=settings.http_max_connections,
            clients=client_slots.ClientSlots(settings.connections_per_client()),
            header_timeout_s=settings.http_header_timeout_s,
            body_timeout_s=settings.http_body_timeout_s,
            write_timeout_s=settings.http_write_timeout_s,
            send_buffer_bytes=settings.http_send_buffer_bytes,
            unsent=unsent,
            refused=self._metrics.refusal,
        )
        return uvicorn.Config(
            self._app,
            host=settings.http_host,
            port=settings.http_port,
            http=connections.protocol_class(limits),
            timeout_keep_alive=settings.http_keepalive_s,
            log_level="warning",
            log_config=None,  # uvicorn's records go to the root handler: one format (text or JSON)
            access_log=False,
            lifespan="off",
            proxy_headers=False,  # nothing reads the client's address: no X-Forwarded-* parsing
            ws="none",  # no websocket route: the same on every install, whatever ws library it has
        )

    async def serve(self, stopping: Callable[[], bool]) -> None:
        """Serve until ``stop``; ``stopping()`` tells a stop asked for from a server that ended
        on its own (an error: the node ends)."""
        if stopping():
            return  # asked to stop before it ran: nothing to serve, no server to tell
        self._server = _Server(self.config())
        await self._server.serve()
        if stopping():
            return
        raise RuntimeError("the HTTP server stopped on its own")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
