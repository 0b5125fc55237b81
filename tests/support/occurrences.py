"""Recurring schedules seen from a consumer: deliveries grouped by the occurrence their
idempotency key names (``schedule:<name>:<occurrence>``), and a ledger of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import httpx

from consumers_sdk import contract
from tests.support.collector import Collector


@dataclass
class OccurrenceLedger:
    """Each expected occurrence: delivered once, more than once, early, or missing; plus any
    delivery of an occurrence not expected."""

    once: int = 0
    duplicated: dict[str, int] = field(default_factory=dict)
    early: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        extra = sum(count - 1 for count in self.duplicated.values())
        return (
            f"occurrences: once={self.once} more than once={len(self.duplicated)} "
            f"(extra deliveries={extra}: {self.duplicated}) early={len(self.early)} "
            f"missing={self.missing} unexpected={self.unexpected}"
        )


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
    ledger = OccurrenceLedger()
    wanted = {moment.strftime("%Y-%m-%dT%H:%M:%SZ"): moment.timestamp() for moment in expected}
    for occurrence, due_s in wanted.items():
        times = got.get(occurrence, [])
        if not times:
            ledger.missing.append(occurrence)
            continue
        if min(times) < due_s:
            ledger.early.append(occurrence)
        if len(times) == 1:
            ledger.once += 1
        else:
            ledger.duplicated[occurrence] = len(times)
    ledger.unexpected = sorted(set(got) - set(wanted))
    return ledger


async def create(url: str, body: dict[str, object]) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.post("/v1/schedules", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, object] = response.json()
    return created
