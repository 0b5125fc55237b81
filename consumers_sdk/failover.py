"""Connections to a RabbitMQ cluster given several node URLs (``broker_urls``).

``connect_robust`` opens a connection to the first node that answers, trying them in the order
given. The connection is aio-pika's robust connection, which restores its channels, exchanges,
queues, bindings and consumers after a reconnect; here each reconnect goes to the next node: when
the node goes away (or an attempt to reach one fails) the connection moves on round the list, so a
node killed for good costs one reconnect interval, not a wait for that node to come back.

``connect`` does the same for a plain connection (a one-off declaration, a command, a reporter
that reconnects by itself): the first node that answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aio_pika
import aiormq
from aio_pika.abc import AbstractConnection, AbstractRobustConnection
from aio_pika.connection import make_url

from consumers_sdk import broker_urls, connections, sockets

logger = logging.getLogger(__name__)

Urls = str | Sequence[str]
Opened = TypeVar("Opened", bound=AbstractConnection)
# How long an attempt to connect may take, reconnects included (``connect_robust``).
CONNECT_TIMEOUT_S = 30.0
# What a node that does not answer raises: the next node is tried.
UNREACHABLE = (OSError, TimeoutError, aiormq.exceptions.AMQPConnectionError)


class KeptAliveTransport(aiormq.connection.TransportFactory):
    """aiormq's TCP or TLS transport, its socket kept alive (``sockets.keep_alive``)."""

    def __init__(self, dead_s: float) -> None:
        self._dead_s = dead_s

    async def create(
        self, url: Any, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        factory: aiormq.connection.TransportFactory = (
            aiormq.connection.TLSTransportFactory()
            if url.scheme == "amqps"
            else aiormq.connection.TCPTransportFactory()
        )
        reader, writer = await factory.create(url, **kwargs)
        sockets.keep_alive(writer.get_extra_info("socket"), self._dead_s)
        return reader, writer


class FailoverConnection(aio_pika.RobustConnection):
    """A robust connection whose every reconnect goes to the next of its URLs."""

    def __init__(self, urls: Sequence[str], *, start: int = 0, **kwargs: Any) -> None:
        self._urls = tuple(make_url(url) for url in urls)
        self._at = start % len(self._urls)
        super().__init__(self._urls[self._at], **kwargs)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        # Called when the connection is lost and when an attempt fails: both move on.
        if not (self._close_called or self.is_closed) and len(self._urls) > 1:
            self._at = (self._at + 1) % len(self._urls)
            self.url = self._urls[self._at]
            logger.info(
                "RabbitMQ node gone; next: %s:%s",
                self.url.host,
                self.url.port,
                extra={"action": "amqp_failover"},
            )
        await super()._on_connection_close(closing)


async def connect_robust(
    urls: Urls,
    *,
    connection_name: str,
    reconnect_interval: float = 1.0,
    connect_timeout_s: float | None = CONNECT_TIMEOUT_S,
    dead_connection_s: float | None = None,
) -> AbstractRobustConnection:
    """A robust connection on the first node that answers; later losses move it round the list.

    CONNECT_TIMEOUT_S bounds every attempt, the reconnects too: one begun while the path to the
    broker dropped packets would otherwise wait out the kernel's connect retries (about two
    minutes) after the path is back. DEAD_CONNECTION_S: each connection's socket is dropped once
    its data goes unacknowledged that long (``sockets.keep_alive``; None: the system's minutes).

    Raises what the last node raised when none answers (the caller retries with its backoff)."""
    listed = broker_urls.parse(urls)

    def attempt(start: int) -> Callable[[], Awaitable[FailoverConnection]]:
        async def open_one() -> FailoverConnection:
            options: dict[str, Any] = {}
            if dead_connection_s is not None:
                options["transport_factory"] = KeptAliveTransport(dead_connection_s)
            connection = FailoverConnection(
                listed,
                start=start,
                client_properties={"connection_name": connection_name},
                reconnect_interval=reconnect_interval,
                **options,
            )
            try:
                await connection.connect(timeout=connect_timeout_s)
            except BaseException:
                with contextlib.suppress(Exception):
                    await connection.close()
                raise
            return connection

        return open_one

    return await _first_answering([attempt(start) for start in range(len(listed))])


async def connect(
    urls: Urls, *, connection_name: str, connect_timeout_s: float | None = None, start: int = 0
) -> AbstractConnection:
    """A plain connection to the first node that answers, trying them from the one at START (a
    caller that reconnects after a failure passes its count, so as not to wait on the same dead
    node first every time)."""

    def attempt(url: str) -> Callable[[], Awaitable[AbstractConnection]]:
        return lambda: aio_pika.connect(
            url,
            client_properties={"connection_name": connection_name},
            timeout=connect_timeout_s,
        )

    listed = broker_urls.parse(urls)
    start %= len(listed)
    return await _first_answering([attempt(url) for url in listed[start:] + listed[:start]])


async def _first_answering(attempts: Sequence[Callable[[], Awaitable[Opened]]]) -> Opened:
    failure: BaseException | None = None
    for open_one in attempts:
        try:
            return await connections.opened(open_one)
        except aiormq.exceptions.ProbableAuthenticationError:
            raise  # the same users on every node: the next would refuse them too
        except UNREACHABLE as exc:
            failure = exc
    assert failure is not None  # parse() never returns an empty list
    raise failure
