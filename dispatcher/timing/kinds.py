"""The kinds of time a node reads, one name each. Pure.

- ``NodeTime`` (parameters named ``now``): the node's time, PostgreSQL's clock as the timekeeper
  measures it, in POSIX seconds: when a job is due, what a lease or a TTL counts from.
- ``NodeDate`` (``now_dt``): the same instant as an aware UTC datetime, for what compares with
  timestamps read from PostgreSQL (a flow rule's pause, a schedule's next occurrence).
- ``Mono`` (``mono``): the monotonic clock (``time.monotonic``): how long something took, when a
  wait or a cache runs out on this host; never compared with a job's time.
- ``NodeClock`` (``timekeeper``): the node's time with what firing needs besides (its error,
  whether it is trusted now): ``timing.timekeeper.Timekeeper``.
- ``Wall`` (``wall``): the host's wall clock. Not a time source (a broken NTP moves it): only the
  timekeeper reads it, to measure it against PostgreSQL's (``tests/unit/test_time_sources.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol, TypeAlias

NodeTime: TypeAlias = Callable[[], float]
NodeDate: TypeAlias = Callable[[], datetime]
Mono: TypeAlias = Callable[[], float]
Wall: TypeAlias = Callable[[], float]


class NodeClock(Protocol):
    """The node's time, and whether firing may go by it (``timing.timekeeper.Timekeeper``)."""

    def now(self) -> float: ...

    def error_s(self) -> float:
        """How far ``now`` may be from PostgreSQL's clock."""

    def trusted(self) -> bool: ...

    async def wait_trusted(self) -> None: ...

    async def resync(self) -> None: ...
