"""Grants: the jobs a flow rule's meter let go, by id, for as long as the meter will not ask for
them again (``looks.PENDING_S``). Pure: the monotonic time is passed in.

A grant belongs to the job, not to an entry in memory: firing rebuilds entries on every path that
gives a claim back (a publish not confirmed, a nack, a self-fence between claim and publish),
and each rebuilt entry is claimed under the same grant, at once, instead of waiting for the meter
to ask again (and spend a second token on the same job).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from dispatcher.flow.looks import PENDING_S

# At most this many grants are kept (the oldest go first): a meter lets go at most its rules'
# rates times PENDING_S, far fewer.
CAP = 1_000_000


class Grants:
    def __init__(self, *, keep_s: float = PENDING_S, cap: int = CAP) -> None:
        self._keep_s = keep_s
        self._cap = cap
        # id -> until when (monotonic) its grant holds; in the order granted, which is the order
        # they run out in (one keep_s for all).
        self._until: dict[uuid.UUID, float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def grant(self, ids: Iterable[uuid.UUID], now_mono: float) -> None:
        until = now_mono + self._keep_s
        for job_id in ids:
            self._until.pop(job_id, None)  # granted again: runs out later, so goes last
            self._until[job_id] = until
        while len(self._until) > self._cap:
            del self._until[next(iter(self._until))]

    def granted(self, ids: Iterable[uuid.UUID], now_mono: float) -> list[uuid.UUID]:
        """Those of ``ids`` whose grant still holds."""
        if not self._until:
            return []
        self._forget_until(now_mono)
        return [job_id for job_id in ids if job_id in self._until]

    def _forget_until(self, now_mono: float) -> None:
        """Drop the grants run out by ``now_mono``: the first ones, in order."""
        ran_out = []
        for job_id, until in self._until.items():
            if until > now_mono:
                break
            ran_out.append(job_id)
        for job_id in ran_out:
            del self._until[job_id]
