"""The two lanes of due jobs, each fair across routing keys. Pure: no I/O, no clock of its own.

``DueHeap`` holds the jobs falling due soon, ``Backlog`` the overdue ones being caught up. Both
hand out a batch round-robin over the routing keys that have jobs ready, so one key with a burst
of a million due jobs takes one turn per key, not the whole batch: a small key's jobs keep their
lateness while the big one drains.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from itertools import chain

from dispatcher.models import DueEntry

# (head run_at, head id, routing key): a key's earliest entry as the top heap saw it. It is stale
# once that entry is no longer the key's head; stale records are dropped when they surface.
_Head = tuple[float, object, str]
# A backlog entry as its key's heap orders it: (rank, run_at, id, entry).
_Ranked = tuple[int, float, object, DueEntry]


class DueHeap:
    """Min-heaps on (run_at, id), one per routing key, under a heap of their heads.

    Duplicates are harmless: a second claim of the same job finds nothing.
    """

    def __init__(self) -> None:
        self._keys: dict[str, list[DueEntry]] = {}
        self._heads: list[_Head] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, entry: DueEntry) -> bool:
        """Add an entry; True when it became the earliest (the firing loop should wake)."""
        self._size += 1
        entries = self._keys.get(entry.key)
        if entries is None:
            entries = self._keys[entry.key] = []
        heapq.heappush(entries, entry)
        if entries[0] is not entry:
            return False
        self._clean()
        head = (entry.run_at_s, entry.id, entry.key)
        heapq.heappush(self._heads, head)
        return self._heads[0] is head

    def extend(self, entries: Iterable[DueEntry]) -> None:
        for entry in entries:
            self.push(entry)

    def next_due_s(self) -> float | None:
        self._clean()
        return self._heads[0][0] if self._heads else None

    def pop_due(self, now_s: float, limit: int) -> list[DueEntry]:
        """Up to ``limit`` entries due at ``now_s``: one per ready routing key in turn, each key's
        earliest first."""
        # A key may surface twice (a record made stale by an earlier push is valid again once
        # that entry is popped): each key takes one place in the turns.
        ready_keys: dict[str, list[DueEntry]] = {}
        while self._heads and self._heads[0][0] <= now_s:
            head = heapq.heappop(self._heads)
            if self._valid(head):
                ready_keys[head[2]] = self._keys[head[2]]
        ready = list(ready_keys.values())
        due: list[DueEntry] = []
        while ready and len(due) < limit:
            still_ready = []
            for position, entries in enumerate(ready):
                due.append(heapq.heappop(entries))
                if entries and entries[0].run_at_s <= now_s:
                    still_ready.append(entries)
                elif entries:
                    self._push_head(entries)
                if len(due) == limit:
                    still_ready.extend(ready[position + 1 :])
                    break
            ready = still_ready
        for entries in ready:  # the limit was reached with these keys still ready
            self._push_head(entries)
        self._size -= len(due)
        self._drop_empty(due)
        return due

    def retain(self, keep: Callable[[DueEntry], bool]) -> int:
        """Drop the entries ``keep`` rejects (shards lost); returns how many were dropped."""
        before = self._size
        self._rebuild(entry for entry in self._all() if keep(entry))
        return before - self._size

    def evict_before(self, cutoff_s: float) -> float | None:
        """Drop the entries due before ``cutoff_s``; returns the earliest one's time, if any."""
        earliest = self.next_due_s()
        if earliest is None or earliest >= cutoff_s:
            return None
        self._rebuild(entry for entry in self._all() if entry.run_at_s >= cutoff_s)
        return earliest

    def trim(self, cap: int) -> DueEntry | None:
        """Keep the ``cap`` earliest entries; returns the latest one kept when anything was evicted.

        The loader moves its cursors back to that entry so the evicted jobs are loaded again later.
        """
        if self._size <= cap:
            return None
        kept = heapq.nsmallest(cap, self._all())
        self._rebuild(kept)
        return kept[-1] if kept else None

    def _all(self) -> Iterable[DueEntry]:
        return chain.from_iterable(self._keys.values())

    def _rebuild(self, entries: Iterable[DueEntry]) -> None:
        by_key: dict[str, list[DueEntry]] = {}
        for entry in entries:
            by_key.setdefault(entry.key, []).append(entry)
        self._keys = by_key
        self._heads = []
        self._size = 0
        for key_entries in by_key.values():
            heapq.heapify(key_entries)
            self._size += len(key_entries)
            self._heads.append((key_entries[0].run_at_s, key_entries[0].id, key_entries[0].key))
        heapq.heapify(self._heads)

    def _valid(self, head: _Head) -> bool:
        entries = self._keys.get(head[2])
        if not entries:
            return False
        return entries[0].id == head[1] and entries[0].run_at_s == head[0]

    def _clean(self) -> None:
        while self._heads and not self._valid(self._heads[0]):
            heapq.heappop(self._heads)

    def _push_head(self, entries: list[DueEntry]) -> None:
        heapq.heappush(self._heads, (entries[0].run_at_s, entries[0].id, entries[0].key))

    def _drop_empty(self, popped: list[DueEntry]) -> None:
        for key in {entry.key for entry in popped}:
            if not self._keys.get(key, True):
                del self._keys[key]


class Backlog:
    """Overdue jobs found at start, at a takeover, left behind by the live lane or let go by a flow
    rule, the routing keys in turn; within a key, the highest priority first, then the oldest."""

    def __init__(self) -> None:
        self._keys: dict[str, list[_Ranked]] = {}
        self._turns: deque[str] = deque()  # keys with entries, next turn first
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def extend(self, entries: Iterable[DueEntry]) -> None:
        for entry in entries:
            queue = self._keys.get(entry.key)
            if queue is None:
                queue = self._keys[entry.key] = []
                self._turns.append(entry.key)
            heapq.heappush(queue, (entry.rank, entry.run_at_s, entry.id, entry))
            self._size += 1

    def pop(self, limit: int) -> list[DueEntry]:
        taken: list[DueEntry] = []
        while self._turns and len(taken) < limit:
            key = self._turns.popleft()
            queue = self._keys[key]
            taken.append(heapq.heappop(queue)[3])
            if queue:
                self._turns.append(key)
            else:
                del self._keys[key]
        self._size -= len(taken)
        return taken

    def retain(self, keep: Callable[[DueEntry], bool]) -> None:
        entries = [
            ranked[3] for key in self._turns for ranked in self._keys[key] if keep(ranked[3])
        ]
        self._keys = {}
        self._turns = deque()
        self._size = 0
        self.extend(entries)
