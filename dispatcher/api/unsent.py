"""What the node's connections hold unsent, pure: bytes of answers the app wrote that the sockets
have not taken yet, against one budget for every connection.

A client that asks for large answers and never reads them makes the node hold each answer whole
(it was rendered before it was written). Past the budget a new answer is refused (503) rather
than made to wait: its body is already in memory, and waiting would keep it there, so only
refusing bounds what the node holds. Room is first made by closing connections that have taken
no byte for ``stalled_s``, stalled longest first: a client that reads gets its answer, one that
stopped reading loses its place.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(slots=True)
class _Held:
    size: int
    progressed_at: float  # when the socket last took bytes (or the holding began)


class Unsent:
    """The bytes each holder (a connection) holds unsent and when its socket last took some.

    A holder's size is what its answer still has to send: the part the app handed over but not
    yet written to the transport, plus the transport's buffer; it only shrinks when the socket
    takes bytes, so a smaller size is progress."""

    def __init__(self, budget_bytes: int, *, free_bytes: int, stalled_s: float) -> None:
        self.budget_bytes = budget_bytes
        self._free_bytes = free_bytes  # a holder holding nothing may always add this much
        self._stalled_s = stalled_s
        self._held: dict[Hashable, _Held] = {}
        self.total_bytes = 0

    def holds(self, holder: Hashable) -> int:
        held = self._held.get(holder)
        return held.size if held else 0

    def progressed_at(self, holder: Hashable) -> float | None:
        held = self._held.get(holder)
        return held.progressed_at if held else None

    def admit(self, holder: Hashable, size: int, now: float) -> list[Hashable] | None:
        """Room for SIZE more bytes on HOLDER: the holders to close first (already forgotten
        here; often none), or None when there is none (nothing changes: refuse the answer).

        An empty message always fits; so do up to ``free_bytes`` on a holder that holds nothing
        (short answers always go out: at most that much per connection above the budget), and
        any size while no other holder is left (an answer larger than the budget goes out
        alone)."""
        current = self.holds(holder)
        others = self.total_bytes - current
        if size == 0 or (size <= self._free_bytes and current == 0) or others == 0:
            self._add(holder, size, now)
            return []
        evicted: list[Hashable] = []
        stalled = sorted(
            (held.progressed_at, index, other)
            for index, (other, held) in enumerate(self._held.items())
            if other != holder and held.progressed_at <= now - self._stalled_s
        )
        for _, _, other in stalled:
            if others == 0 or others + current + size <= self.budget_bytes:
                break
            others -= self._held[other].size
            evicted.append(other)
        if others != 0 and others + current + size > self.budget_bytes:
            return None
        for other in evicted:
            self.release(other)
        self._add(holder, size, now)
        return evicted

    def update(self, holder: Hashable, size: int, now: float) -> None:
        """HOLDER holds SIZE bytes now (as measured); smaller than before means progress."""
        held = self._held.get(holder)
        if size <= 0:
            self.release(holder)
        elif held is None:
            self._held[holder] = _Held(size, now)
            self.total_bytes += size
        else:
            if size < held.size:
                held.progressed_at = now
            self.total_bytes += size - held.size
            held.size = size

    def progressed(self, holder: Hashable, now: float) -> None:
        """HOLDER's client took bytes its size does not show (from the kernel's own buffer)."""
        held = self._held.get(holder)
        if held is not None:
            held.progressed_at = now

    def release(self, holder: Hashable) -> None:
        """HOLDER holds nothing any more (all taken, or closed)."""
        held = self._held.pop(holder, None)
        if held is not None:
            self.total_bytes -= held.size

    def _add(self, holder: Hashable, size: int, now: float) -> None:
        held = self._held.get(holder)
        if held is None:
            self._held[holder] = _Held(size, now)
        else:
            held.size += size
        self.total_bytes += size
