"""Admission: what firing asks of flow control, and all it knows of it.

Flow control (``flow.control.FlowControl``) holds back the jobs of the routing keys an operator
or a tenant paused or metered. Firing asks it three things: what the loads and claims pass over
now (``held``), which of a batch's jobs a meter let go though their rule holds their key
(``granted``: by job id, so a job given back after a failed publish keeps its grant whichever
path put it back), and whether a rule held a job (``held_at``: its lateness was an operator's
choice and counts apart). ``OPEN`` is a node without flow control: nothing held.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Protocol

from dispatcher.flow.rules import NOTHING_HELD, HeldKeys


class Admission(Protocol):
    def held(self) -> HeldKeys:
        """What flow rules hold now: the loads, sweeps and claims pass over it."""

    def granted(self, ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
        """Those of ``ids`` a flow rule's meter let go: claimed though their rule holds them."""

    def held_at(self, routing_key: str, namespace: str | None, run_at: datetime) -> bool:
        """Whether a flow rule held a job due at ``run_at`` (now, or until a release since)."""


class Open:
    """No flow control: nothing is held, so nothing needs a grant."""

    def held(self) -> HeldKeys:
        return NOTHING_HELD

    def granted(self, ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
        return []

    def held_at(self, routing_key: str, namespace: str | None, run_at: datetime) -> bool:
        return False


OPEN: Admission = Open()
