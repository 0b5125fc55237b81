"""The one hand-off from foreign threads (kazoo's) to the event loop. Imports no kazoo.

Callbacks running on another thread only post here; the work happens on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Generic, TypeVar

T = TypeVar("T")


class ThreadToLoop(Generic[T]):
    """A queue that any thread may put into without blocking; the loop consumes it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[T] = asyncio.Queue()

    def post(self, item: T) -> None:
        """Safe from any thread; a no-op once the loop is closed (shutdown)."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self) -> T:
        return await self._queue.get()
