"""A raw LISTEN on the due-notice channel, as a dispatcher node holds one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

CHANNEL = "dispatcher_due"


class Listener:
    """The due notices PostgreSQL delivered (only on commit), in order."""

    def __init__(self) -> None:
        self.payloads: asyncio.Queue[str] = asyncio.Queue()

    def on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.put_nowait(payload)

    async def drained(self, quiet_s: float = 0.5) -> list[str]:
        """Everything received until nothing more arrives for ``quiet_s``."""
        got = []
        while True:
            try:
                async with asyncio.timeout(quiet_s):
                    got.append(await self.payloads.get())
            except TimeoutError:
                return got


@asynccontextmanager
async def listening(database_url: str) -> AsyncIterator[Listener]:
    connection = await asyncpg.connect(database_url)
    listener = Listener()
    await connection.add_listener(CHANNEL, listener.on_notify)
    try:
        yield listener
    finally:
        await connection.close()
