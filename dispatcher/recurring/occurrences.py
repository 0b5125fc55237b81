"""When a schedule fires: its occurrences as UTC instants, and which of them a materialiser pass
turns into jobs (the ``missed`` policy). Pure: ``now`` is always passed in.

Time zones and daylight saving time (cron schedules; intervals are plain UTC arithmetic):

- A wall-clock time that does not exist (skipped by a spring-forward, e.g. 02:30 on the night
  New York moves from 02:00 to 03:00) fires at the first valid instant after the gap (03:00 local),
  once: every time in the gap and the first valid time itself map to that one instant.
- A wall-clock time that happens twice (a fall-back, e.g. 01:30 in New York in November) fires
  once, at its first occurrence (``fold=0``, the offset before the change).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from consumers_sdk import schedule_rules, validation
from dispatcher.recurring import cron

_TICK = timedelta(microseconds=1)
_EARLIEST = datetime.min.replace(tzinfo=UTC)
# The range a schedule's start_at and end_at must fall in (the API refuses the rest, naming the
# field): what a Python datetime holds, less a day at each end, so that the wall clock of any zone
# and the occurrence search stay inside it, and clear of datetime.min and datetime.max in UTC,
# which asyncpg stores as -infinity and infinity (and reads back as naive datetimes).
MIN_TIME = datetime(1, 1, 2, tzinfo=UTC)
MAX_TIME = datetime(9999, 12, 30, tzinfo=UTC)
# Whatever the expression, a gap is at most a day long (Samoa, 2011): a bound, not a guess.
_MAX_GAP = timedelta(days=2)


class Missed(enum.StrEnum):
    """What a pass does with occurrences late by more than the grace (after downtime)."""

    ALL = "all"  # fire each of them (at most the pass's bound at a time)
    LATEST = "latest"  # fire only the most recent of them
    SKIP = "skip"  # fire none; go on with the next one not missed


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """When a schedule fires: a cron expression in a zone, or a fixed interval from ``start_at``."""

    cron: str | None = None
    timezone: str = schedule_rules.DEFAULT_TIMEZONE
    interval_s: int | None = None
    start_at: datetime
    end_at: datetime | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give cron or interval_s, not both")

    def after(self, moment: datetime) -> datetime | None:
        """The first occurrence strictly after ``moment`` (aware), or None when there is none
        (past ``end_at``, or past the year 9999 that datetime ends with)."""
        try:
            found = self._unbounded_after(moment)
        except OverflowError:
            return None
        if found is None or (self.end_at is not None and found > self.end_at):
            return None
        return found

    def at_or_after(self, moment: datetime) -> datetime | None:
        """The first occurrence at or after ``moment``."""
        # (0001-01-01T00:00:00Z itself is never an occurrence: nothing is before it.)
        return self.after(moment - _TICK if moment > _EARLIEST else moment)

    def first(self) -> datetime | None:
        """The first occurrence at or after ``start_at``."""
        return self.at_or_after(self.start_at)

    def jobs_per_hour(self) -> float:
        """The most jobs it makes in an hour: an interval's share of it, or a cron expression's
        minutes (its busiest hour fires on each of them). What a namespace's quota counts."""
        if self.interval_s is not None:
            return 3600 / self.interval_s
        assert self.cron is not None
        return float(len(cron.parse(self.cron).minutes))

    def upcoming(self, moment: datetime, count: int) -> list[datetime]:
        """Up to ``count`` occurrences at or after ``moment`` (and at or after ``start_at``)."""
        found: list[datetime] = []
        current = self.at_or_after(max(moment, self.start_at))
        while current is not None and len(found) < count:
            found.append(current)
            current = self.after(current)
        return found

    def _unbounded_after(self, moment: datetime) -> datetime | None:
        if self.interval_s is not None:
            if moment < self.start_at:
                return self.start_at
            step = timedelta(seconds=self.interval_s)
            return self.start_at + ((moment - self.start_at) // step + 1) * step
        assert self.cron is not None
        return _cron_after(_parsed(self.cron), ZoneInfo(self.timezone), moment)


_parsed = functools.lru_cache(maxsize=1024)(cron.parse)


def _cron_after(expression: cron.Cron, zone: ZoneInfo, moment: datetime) -> datetime | None:
    # The wall-clock search may propose an instant not after ``moment``: the second pass through
    # a repeated hour (mapped to the first, fold=0), or a gap time mapped to an instant already
    # passed. Step on until an instant is later; each step moves the wall clock forward.
    wall = moment.astimezone(zone).replace(tzinfo=None)
    while True:
        candidate = expression.next_after(wall)
        if candidate is None:
            return None
        instant = to_instant(candidate, zone)
        if instant > moment:
            return instant
        wall = candidate


def to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """A naive wall-clock time in ``zone`` as a UTC instant: a time in a spring-forward gap maps
    to the first valid instant after the gap; a repeated time to its first occurrence."""
    instant = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if _exists(wall, zone, instant):
        return instant
    later = wall
    while later - wall <= _MAX_GAP:  # the first whole minute after the gap
        later += timedelta(minutes=1)
        instant = later.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if _exists(later, zone, instant):
            return instant
    raise ValueError(f"{wall} in {zone.key}: no valid time within {_MAX_GAP}")


def _exists(wall: datetime, zone: ZoneInfo, instant: datetime) -> bool:
    return instant.astimezone(zone).replace(tzinfo=None) == wall


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One pass over one schedule: the occurrences to turn into jobs, whether missed ones were
    passed over, and where the schedule continues (None: it has ended)."""

    fire: list[datetime]
    skipped_missed: bool
    next_at: datetime | None


def plan(
    timing: Timing,
    next_at: datetime,
    *,
    now: datetime,
    ahead_s: float,
    grace_s: float,
    missed: Missed,
    limit: int,
    catchup_s: float,
) -> Plan:
    """The occurrences from ``next_at`` up to ``now + ahead_s`` to fire in this pass.

    An occurrence earlier than ``now - grace_s`` is missed (the nodes were down or behind) and
    ``missed`` decides whether it fires. At most ``limit`` fire per pass; the next pass goes on
    where this one stopped, so a long catch-up under ``all`` is spread over passes. ``latest`` and
    ``skip`` jump over a run of missed occurrences without walking it (a year of minutes).

    Nothing older than ``now - catchup_s`` is made up for, whatever the policy: that is missed
    even within a longer grace, and ``all`` passes over it. So a catch-up (after downtime, or from
    a ``start_at`` far in the past) makes at most what the schedule makes in ``catchup_s``.
    """
    horizon = now + timedelta(seconds=ahead_s)
    oldest = now - timedelta(seconds=catchup_s)
    late_before = max(now - timedelta(seconds=grace_s), oldest)
    fire: list[datetime] = []
    skipped = False
    current: datetime | None = next_at
    if timing.end_at is not None and next_at > timing.end_at:
        current = None
    if current is not None and current < late_before and missed is not Missed.ALL:
        if missed is Missed.LATEST:
            fire.append(_latest_before(timing, current, late_before))
        current = timing.at_or_after(late_before)
        skipped = missed is Missed.SKIP or fire[0] != next_at
    elif current is not None and current < oldest:  # all: only the last catchup_s of them
        current = timing.at_or_after(oldest)
        skipped = True
    while current is not None and current <= horizon and len(fire) < limit:
        fire.append(current)
        current = timing.after(current)
    return Plan(fire=fire, skipped_missed=skipped, next_at=current)


def _latest_before(timing: Timing, earliest: datetime, before: datetime) -> datetime:
    """The last occurrence in [earliest, before), given that ``earliest`` is one: look back over a
    window that doubles until it holds one, so the walk stays short whatever the gap."""
    window = timedelta(minutes=1)
    while True:
        if window >= before - earliest:
            found: datetime | None = earliest
        else:
            found = timing.at_or_after(before - window)
        if found is not None and found < before:
            latest = found
            while (following := timing.after(latest)) is not None and following < before:
                latest = following
            return latest
        window *= 2


def idempotency_key(name: str, occurrence: datetime) -> str:
    """The key of an occurrence's job: one job per schedule and occurrence, whichever node and
    however often a pass runs. RFC 3339 UTC, with microseconds only when there are some."""
    return f"{validation.SCHEDULE_KEY_PREFIX}{name}:{rfc3339(occurrence)}"


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
