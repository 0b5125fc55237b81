"""Quarantine: which jobs firing suspects of breaking their batch, and how often each failed alone.

A batch that fails for a reason that is not a service being away (a bug, a row that cannot be
decoded, a message the broker refuses) cannot say which job caused it. Every job of it becomes a
suspect and is fired alone from then on; a suspect that fires fine is cleared, one that fails
alone takes a strike (if other jobs fired since its last one: a failure of everything is no
job's fault) and is tried again a little later, and at ``max_strikes`` it is parked (dead, with
the reason) instead of being retried forever. Pure: no I/O, no clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

MAX_STRIKES = 3
STRIKE_DELAY_S = 1.0  # before a suspect is tried alone again, doubled per strike


@dataclass(slots=True)
class Suspect:
    strikes: int = 0
    reason: str = ""
    progress: int = -1  # the caller's progress figure at the last strike


class Quarantine:
    def __init__(self, *, max_strikes: int = MAX_STRIKES, cap: int = 100_000) -> None:
        self._max_strikes = max_strikes
        self._cap = cap
        self._suspects: dict[uuid.UUID, Suspect] = {}

    def __len__(self) -> int:
        return len(self._suspects)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._suspects

    def suspect(self, ids: Iterable[uuid.UUID]) -> None:
        """These jobs failed together: each is fired alone from now on."""
        for job_id in ids:
            if job_id not in self._suspects and len(self._suspects) >= self._cap:
                # Full (a bug failing every batch): the oldest go back to batches, where a
                # failure makes them suspects again. Memory stays bounded either way.
                del self._suspects[next(iter(self._suspects))]
            self._suspects.setdefault(job_id, Suspect())

    def strike(self, job_id: uuid.UUID, reason: str, *, progress: int | None = None) -> bool:
        """This job failed alone; True once it has failed ``max_strikes`` times (park it).

        A failure the broker aimed at this message (a nack) always counts. For any other,
        ``progress`` is a figure that grows while other jobs succeed (publishes confirmed): it
        counts only if that grew since the job's previous strike, so jobs are not parked while
        everything fails for a reason of no job's own."""
        suspect = self._suspects.setdefault(job_id, Suspect())
        suspect.reason = reason
        if progress is None or progress != suspect.progress:
            suspect.strikes += 1
            suspect.progress = -1 if progress is None else progress
        return suspect.strikes >= self._max_strikes

    def delay_s(self, job_id: uuid.UUID) -> float:
        """How long a struck job waits before it is tried again."""
        suspect = self._suspects.get(job_id)
        strikes = suspect.strikes if suspect else 0
        return 0.0 if strikes == 0 else STRIKE_DELAY_S * 2 ** (strikes - 1)

    def clear(self, ids: Iterable[uuid.UUID]) -> None:
        """These jobs were fired (or parked, or finished otherwise): no longer suspects."""
        for job_id in ids:
            self._suspects.pop(job_id, None)
