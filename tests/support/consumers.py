"""An SDK Consumer running inside the test's event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from consumers_sdk import Consumer, Job, Reject


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


def fail_once_and_reject(
    consumer: Consumer, *, retry_key: str, poison_key: str, tier_s: float
) -> dict[str, list[float]]:
    """Handlers for the retry and dead-letter fault tests: a job of RETRY_KEY fails its first
    attempt (retried after TIER_S) then succeeds; one of POISON_KEY is rejected (dead at once).
    Returns where the successes are recorded (job id -> times)."""
    succeeded: dict[str, list[float]] = {}

    @consumer.handler(retry_key, max_attempts=5, backoff=lambda _: tier_s)
    async def flaky(job: Job) -> None:
        if job.attempt == 1:
            raise RuntimeError("first attempt fails")
        succeeded.setdefault(job.id, []).append(time.time())

    @consumer.handler(poison_key)
    async def poison(job: Job) -> None:
        raise Reject("never handled")

    return succeeded
