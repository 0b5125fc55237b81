"""A TCP relay on 127.0.0.1 to a service, in the test's own loop: a node given the relay's port
reaches the service through it until ``cut()``, which closes the port and every connection
(a new one is refused: the driver's error names the host and the port), until ``heal()``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Relay:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.port = 0

    async def open(self) -> None:
        """Listen (on the port of the first opening, when healing); idempotent."""
        if self._server is None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Close the port and every relayed connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def heal(self) -> None:
        await self.open()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        ends = [writer]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
            ends.append(upstream_writer)
            async with asyncio.TaskGroup() as group:
                group.create_task(_pump(reader, upstream_writer))
                group.create_task(_pump(upstream_reader, writer))
        except* (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in ends:
                end.close()
            self._pipes.discard(task)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while data := await source.read(65536):
        sink.write(data)
        await sink.drain()
    with contextlib.suppress(OSError):
        sink.write_eof()


@contextlib.asynccontextmanager
async def relay(host: str, port: int) -> AsyncIterator[Relay]:
    made = Relay(host, port)
    await made.open()
    try:
        yield made
    finally:
        await made.cut()
