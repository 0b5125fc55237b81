"""Producers that keep submitting single jobs through a fault, and what they were answered."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from devstack.spread import run_at_s
from tests.support.nodes import WRITE


@dataclass
class Submissions:
    """What a steady producer saw: the jobs answered 2xx, and how each refusal was answered."""

    accepted: dict[str, float] = field(default_factory=dict)
    refused: list[tuple[int, float]] = field(default_factory=list)  # (status, seconds to answer)


async def submit_steadily(url: str, seen: Submissions, stop: asyncio.Event, workers: int) -> None:
    """Single POSTs, due 0.5-3 s ahead, from ``workers`` concurrent producers until ``stop``."""

    async def producer(number: int, http: httpx.AsyncClient) -> None:
        sent = 0
        while not stop.is_set():
            body = {"routing_key": "e2e.work", "payload": sent, "delay_ms": 500 + sent % 2500}
            started = time.monotonic()
            response = await http.post("/v1/jobs", json=body)
            answered_in = time.monotonic() - started
            if response.is_success:
                job = response.json()
                seen.accepted[job["id"]] = run_at_s(job)
            else:
                seen.refused.append((response.status_code, answered_in))
            sent += 1
            await asyncio.sleep(0.02)  # a steady trickle, not a load test

    async with (
        httpx.AsyncClient(base_url=url, timeout=30, headers=WRITE) as http,
        asyncio.TaskGroup() as group,
    ):
        for number in range(workers):
            group.create_task(producer(number, http), name=f"producer-{number}")
