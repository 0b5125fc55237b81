"""DueHeap: the jobs due soon, earliest first. Pure: no I/O, no clock of its own."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable

from dispatcher.models import DueEntry


class DueHeap:
    """A min-heap on (run_at, id). Duplicates are harmless: a second claim finds nothing."""

    def __init__(self) -> None:
        self._entries: list[DueEntry] = []

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, entry: DueEntry) -> bool:
        """Add an entry; True when it became the earliest (the firing loop should wake)."""
        heapq.heappush(self._entries, entry)
        return self._entries[0] is entry

    def extend(self, entries: Iterable[DueEntry]) -> None:
        for entry in entries:
            heapq.heappush(self._entries, entry)

    def next_due_s(self) -> float | None:
        return self._entries[0].run_at_s if self._entries else None

    def pop_due(self, now_s: float, limit: int) -> list[DueEntry]:
        """Up to ``limit`` entries due at ``now_s``, earliest first."""
        due: list[DueEntry] = []
        entries = self._entries
        while entries and len(due) < limit and entries[0].run_at_s <= now_s:
            due.append(heapq.heappop(entries))
        return due

    def retain(self, keep: Callable[[DueEntry], bool]) -> int:
        """Drop the entries ``keep`` rejects (shards lost); returns how many were dropped."""
        before = len(self._entries)
        self._entries = [entry for entry in self._entries if keep(entry)]
        heapq.heapify(self._entries)
        return before - len(self._entries)

    def trim(self, cap: int) -> DueEntry | None:
        """Keep the ``cap`` earliest entries; returns the latest one kept when anything was evicted.

        The loader moves its cursors back to that entry so the evicted jobs are loaded again later.
        """
        if len(self._entries) <= cap:
            return None
        self._entries = heapq.nsmallest(cap, self._entries)  # sorted, hence a valid heap
        return self._entries[-1] if self._entries else None


class Backlog:
    """Overdue jobs found at start or takeover, fired oldest first beside the live heap."""

    def __init__(self) -> None:
        self._entries: deque[DueEntry] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def extend(self, entries: Iterable[DueEntry]) -> None:
        self._entries.extend(entries)

    def pop(self, limit: int) -> list[DueEntry]:
        return [self._entries.popleft() for _ in range(min(limit, len(self._entries)))]

    def retain(self, keep: Callable[[DueEntry], bool]) -> None:
        self._entries = deque(entry for entry in self._entries if keep(entry))
