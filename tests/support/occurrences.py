"""Recurring schedules seen from a consumer: deliveries grouped by the occurrence their
idempotency key names (``schedule:<name>:<occurrence>``), classified like jobs by ``classify``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import httpx

from consumers_sdk import contract
from devstack.collector import Collector, Ledger, classify
from tests.support.nodes import WRITE


@dataclass
class OccurrenceLedger:
    """Each expected occurrence (delivered once, more than once, early, lost), and deliveries of
    occurrences not expected."""

    ledger: Ledger
    unexpected: list[str]

    def __str__(self) -> str:
        return f"{self.ledger} duplicated={self.ledger.duplicated} unexpected={self.unexpected}"


def arrivals(collector: Collector, name: str) -> dict[str, list[float]]:
    """Occurrence (RFC 3339 UTC) -> arrival times of its deliveries."""
    prefix = f"schedule:{name}:"
    found: dict[str, list[float]] = {}
    for deliveries in collector.deliveries.values():
        for delivery in deliveries:
            key = str(delivery.headers.get(contract.HEADER_IDEMPOTENCY_KEY, ""))
            if key.startswith(prefix):
                found.setdefault(key.removeprefix(prefix), []).append(delivery.received_at)
    return found


def reckon(collector: Collector, name: str, expected: list[datetime]) -> OccurrenceLedger:
    got = arrivals(collector, name)
    wanted = {moment.strftime("%Y-%m-%dT%H:%M:%SZ"): moment.timestamp() for moment in expected}
    return OccurrenceLedger(classify(wanted, got), sorted(set(got) - set(wanted)))


async def create(url: str, body: dict[str, object]) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=WRITE) as http:
        response = await http.post("/v1/schedules", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, object] = response.json()
    return created
