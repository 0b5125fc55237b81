"""The optional de-duplication hook: delivery is at-least-once, so a job id can arrive twice."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class Deduplicator(Protocol):
    """Skip deliveries whose job id was already handled.

    ``seen`` is asked before the handler runs; ``remember`` is called once the delivery is acked.
    A job that arrives again between the two (two consumers racing on one duplicate) still runs
    twice: only an idempotent handler, or a unique key in the handler's own transaction, closes
    that window.
    """

    async def seen(self, job_id: str) -> bool: ...

    async def remember(self, job_id: str) -> None: ...


class MemoryDeduplicator:
    """The last ``capacity`` job ids this process handled; share a store across processes."""

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    async def seen(self, job_id: str) -> bool:
        return job_id in self._ids

    async def remember(self, job_id: str) -> None:
        self._ids[job_id] = None
        self._ids.move_to_end(job_id)
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
