"""Waiting on a condition with a deadline, for state a test can only observe from outside."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx


async def eventually(
    condition: Callable[[], bool], deadline_s: float, poll_s: float = 0.05
) -> None:
    """Return once ``condition()`` holds; TimeoutError after ``deadline_s``."""
    async with asyncio.timeout(deadline_s):
        while not condition():  # noqa: ASYNC110 - the state lives in other processes or threads
            await asyncio.sleep(poll_s)


async def until(check: Callable[[], Awaitable[bool]], deadline_s: float = 10) -> None:
    """Return once ``await check()`` holds (state in PostgreSQL, say); TimeoutError after
    ``deadline_s``."""
    async with asyncio.timeout(deadline_s):
        while not await check():  # noqa: ASYNC110 - the state is in another process
            await asyncio.sleep(0.05)


async def job_when(
    http: httpx.AsyncClient, job_id: str, state: str, deadline_s: float = 30
) -> dict[str, Any]:
    """The job as ``GET /v1/jobs/{id}`` shows it once it is in ``state``."""
    found: dict[str, Any] = {}

    async def check() -> bool:
        found.update((await http.get(f"/v1/jobs/{job_id}")).json())
        return found["state"] == state

    async with asyncio.timeout(deadline_s):
        while not await check():  # noqa: ASYNC110 - state in another process
            await asyncio.sleep(0.1)
    return found


async def ignored_steps(http: httpx.AsyncClient, job_id: str, count: int) -> list[tuple[str, str]]:
    """The (event, reason) of the job's ignored history steps, once there are ``count``."""
    found: list[tuple[str, str]] = []

    async def enough() -> bool:
        history = (await http.get(f"/v1/jobs/{job_id}")).json()["history"]
        found[:] = [(step["event"], step["ignored"]) for step in history if step.get("ignored")]
        return len(found) >= count

    await until(enough, 30)
    return found
