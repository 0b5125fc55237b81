"""After a fault: what a healed node must show from outside."""

from __future__ import annotations

import httpx

from devstack.collector import Collector
from tests.support.nodes import WRITE


async def assert_serving_again(url: str, collector: Collector) -> None:
    """A new job is answered 201 and delivered, and ``/readyz`` answers 200."""
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=WRITE) as http:
        after = await http.post("/v1/jobs", json={"routing_key": "e2e.after", "payload": 1})
        assert after.status_code == 201, after.text
        assert await collector.wait_for([after.json()["id"]], 30) == set()
        ready = await http.get("/readyz")
    assert ready.status_code == 200, ready.text
