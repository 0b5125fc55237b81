"""Schedule jobs through the API, spread evenly over a window, and remember what was accepted."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import httpx


async def submit_spread(
    urls: str | Sequence[str],
    count: int,
    over_s: float,
    *,
    start_in_s: float = 1.0,
    routing_key: str = "e2e.work",
    batch: int = 500,
    api_key: str | None = None,
) -> list[dict[str, Any]]:
    """POST ``count`` jobs due evenly over ``over_s`` in batches, round-robin over ``urls``;
    returns the accepted jobs as the API answered them."""
    nodes = [urls] if isinstance(urls, str) else list(urls)
    base = time.time() + start_in_s
    accepted: list[dict[str, Any]] = []
    headers = {
        "content-type": "application/json",
        **({"authorization": f"Bearer {api_key}"} if api_key else {}),
    }
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        for number, first in enumerate(range(0, count, batch)):
            jobs = [
                {
                    "routing_key": routing_key,
                    "payload": {"n": i},
                    "run_at": datetime.fromtimestamp(base + over_s * i / count, UTC).isoformat(),
                }
                for i in range(first, min(first + batch, count))
            ]
            url = nodes[number % len(nodes)]
            response = await http.post(f"{url}/v1/jobs/batch", json={"jobs": jobs})
            assert response.status_code == 201, response.text
            accepted.extend(response.json()["jobs"])
    return accepted


def run_at_s(job: dict[str, Any]) -> float:
    return datetime.fromisoformat(job["run_at"]).timestamp()


async def schedule_spread(
    urls: str | Sequence[str], count: int, over_s: float, **options: Any
) -> dict[str, float]:
    """As ``submit_spread``; returns accepted id -> run_at (epoch seconds), for the ledger."""
    jobs = await submit_spread(urls, count, over_s, **options)
    return {job["id"]: run_at_s(job) for job in jobs}
