"""Waiting on a condition with a deadline, for state a test can only observe from outside."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(
    condition: Callable[[], bool], deadline_s: float, poll_s: float = 0.05
) -> None:
    """Return once ``condition()`` holds; TimeoutError after ``deadline_s``."""
    async with asyncio.timeout(deadline_s):
        while not condition():  # noqa: ASYNC110 - the state lives in other processes or threads
            await asyncio.sleep(poll_s)
