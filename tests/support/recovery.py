"""After a fault: what a healed node must show from outside."""

from __future__ import annotations

import asyncio
import time

import httpx

from devstack.collector import Collector
from tests.support.nodes import WRITE

# A loop that failed last, at the fault's very end, shows degraded until its new run has lasted
# supervision.HEALTHY_AFTER_S (5 s) after its backoff: /readyz may take that long to agree.
READY_AGAIN_S = 20.0


async def assert_serving_again(url: str, collector: Collector) -> None:
    """A new job is answered 201 and delivered, and ``/readyz`` answers 200 within
    READY_AGAIN_S."""
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=WRITE) as http:
        after = await http.post("/v1/jobs", json={"routing_key": "e2e.after", "payload": 1})
        assert after.status_code == 201, after.text
        assert await collector.wait_for([after.json()["id"]], 30) == set()
        deadline = time.monotonic() + READY_AGAIN_S
        while (ready := await http.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, ready.text
            await asyncio.sleep(0.2)
