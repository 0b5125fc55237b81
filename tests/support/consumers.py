"""An SDK Consumer running inside the test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from consumers_sdk import Consumer


@asynccontextmanager
async def running(consumer: Consumer) -> AsyncIterator[Consumer]:
    task = asyncio.create_task(consumer.run(handle_signals=False))
    ready = asyncio.create_task(consumer.ready.wait())
    await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield consumer
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 30)
