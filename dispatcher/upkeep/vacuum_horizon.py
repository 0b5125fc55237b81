"""How old the oldest snapshot holding vacuum back is, and whether that is past the warning.

While a snapshot is held (a report's open transaction, a ``pg_dump``, a prepared transaction, a
replication slot whose consumer stopped), PostgreSQL removes no row that died after it began:
the queue's tables and indexes fill with dead entries and every scan that walks them slows.
The node cannot end another's snapshot; it says so, in ``/readyz`` and ``/metrics``, once the
oldest is older than the setting, naming the holder, so that an operator can.

A holder's age is what PostgreSQL says (a transaction's start, a prepared transaction's time),
or, where it says none (a replication slot; another role's session, to a role without
pg_read_all_stats), how long this node has seen the same holder keep the same xmin: a lower
bound that grows from the node's first look.

Pure: no I/O; the caller passes the looks and the monotonic time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Holder:
    """One holder of an old snapshot: its kind (session, prepared transaction, replication
    slot), which one (a session's pid and application, a prepared transaction's gid, a slot's
    name), the xmin it holds, that xmin's age in transactions, and how long PostgreSQL says it
    has been held (None: it keeps no such time, as for a slot)."""

    kind: str
    name: str
    xmin: str
    xmin_age: int
    held_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Look:
    """The oldest holders, oldest xmin first; and whether other roles' sessions said when their
    transactions began."""

    holders: list[Holder]
    sees_all_sessions: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Oldest:
    holder: Holder
    age_s: float


class Horizon:
    def __init__(self, *, warn_after_s: float) -> None:
        self.warn_after_s = warn_after_s
        self._first_seen: dict[tuple[str, str, str], float] = {}
        self.oldest: Oldest | None = None
        self.sees_all_sessions = True

    def saw(self, look: Look, now: float) -> None:
        """A look's holders, at monotonic NOW."""
        keys = {(holder.kind, holder.name, holder.xmin) for holder in look.holders}
        # A holder gone, or holding a newer xmin, starts again.
        self._first_seen = {key: self._first_seen.get(key, now) for key in keys}
        oldest: Oldest | None = None
        for holder in look.holders:
            seen_s = now - self._first_seen[(holder.kind, holder.name, holder.xmin)]
            age_s = max(seen_s, holder.held_s or 0.0)
            if oldest is None or age_s > oldest.age_s:
                oldest = Oldest(holder=holder, age_s=age_s)
        self.oldest = oldest
        self.sees_all_sessions = look.sees_all_sessions

    @property
    def held_back(self) -> bool:
        """Whether the oldest snapshot is older than the warning."""
        return self.oldest is not None and self.oldest.age_s > self.warn_after_s

    def describe(self) -> dict[str, object]:
        """For ``/readyz``: the oldest snapshot's age and holder, and whether it is past the
        warning (``holder`` is free text: for admin keys)."""
        oldest = self.oldest
        answer: dict[str, object] = {
            "held_back": self.held_back,
            "oldest_snapshot_s": None if oldest is None else round(oldest.age_s, 1),
            "warn_after_s": self.warn_after_s,
            "sees_all_sessions": self.sees_all_sessions,
        }
        if oldest is not None:
            answer["xmin_age"] = oldest.holder.xmin_age
            answer["holder"] = f"{oldest.holder.kind} {oldest.holder.name}"
        return answer
