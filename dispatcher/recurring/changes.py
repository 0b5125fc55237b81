"""The rules of a schedule's definition: which timings are valid, and how a change (PATCH) merges
into a stored schedule. Pure: ``now`` and the configured floor are passed in; a refusal is an
``errors.InvalidField`` naming the field the owner gave."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from datetime import datetime

from dispatcher import errors
from dispatcher.recurring import model
from dispatcher.recurring.occurrences import Missed, Timing

# The floor of an interval not given in this change: one stored before the configured floor was
# raised may still be paused, resumed or given a new job.
STORED_MIN_INTERVAL_S = 1


def check_timing(
    cron_expression: str | None,
    interval_s: int | None,
    start_at: datetime,
    end_at: datetime | None,
    *,
    min_interval_s: int,
) -> None:
    """Refuse, naming the field, anything but exactly one of cron and interval_s, an interval
    shorter than ``min_interval_s``, or an end before the start."""
    if cron_expression is None and interval_s is None:
        raise errors.InvalidField("cron", "give cron or interval_s")
    if cron_expression is not None and interval_s is not None:
        raise errors.InvalidField("interval_s", "give cron or interval_s, not both")
    if interval_s is not None and interval_s < min_interval_s:
        raise errors.InvalidField(
            "interval_s", f"must be at least {min_interval_s} (DISPATCHER_SCHEDULE_MIN_INTERVAL_S)"
        )
    if end_at is not None and end_at < start_at:
        raise errors.InvalidField("end_at", "must not be before start_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleChange:
    """What a change asks for. ``cron``, ``interval_s`` and ``end_at`` change when named in
    ``given`` (so ``end_at=None`` given removes the end, and switching between cron and an
    interval clears the other); every other field changes when it is not None."""

    given: Set[str]
    paused: bool | None = None
    cron: str | None = None
    timezone: str | None = None
    interval_s: int | None = None
    template: model.Template | None = None
    end_at: datetime | None = None
    missed: Missed | None = None
    grace_s: float | None = None


def merged_timing(old: Timing, change: ScheduleChange, *, min_interval_s: int) -> Timing:
    """The timing after ``change``; ``min_interval_s`` binds only an interval it gives."""
    given = change.given
    cron_expression = change.cron if "cron" in given else old.cron
    interval_s = change.interval_s if "interval_s" in given else old.interval_s
    if "cron" in given and change.cron is not None and "interval_s" not in given:
        interval_s = None  # switching to cron
    if "interval_s" in given and change.interval_s is not None and "cron" not in given:
        cron_expression = None  # switching to an interval
    end_at = change.end_at if "end_at" in given else old.end_at
    floor_s = min_interval_s if "interval_s" in given else STORED_MIN_INTERVAL_S
    check_timing(cron_expression, interval_s, old.start_at, end_at, min_interval_s=floor_s)
    return Timing(
        cron=cron_expression,
        timezone=change.timezone or old.timezone,
        interval_s=interval_s,
        start_at=old.start_at,
        end_at=end_at,
    )


def merged(
    current: model.Schedule, change: ScheduleChange, *, now: datetime, min_interval_s: int
) -> tuple[model.ScheduleSpec, datetime | None]:
    """The merged definition and where the schedule goes on (its new ``next_at``). A new timing,
    or a resume, starts over from now (occurrences already made jobs keep their jobs: same keys,
    no duplicates); other changes keep ``next_at``."""
    old = current.spec
    timing = merged_timing(old.timing, change, min_interval_s=min_interval_s)
    paused = old.paused if change.paused is None else change.paused
    spec = model.ScheduleSpec(
        name=old.name,
        timing=timing,
        template=change.template or old.template,
        missed=change.missed or old.missed,
        grace_s=old.grace_s if change.grace_s is None else change.grace_s,
        paused=paused,
    )
    next_at = current.next_at
    if timing != old.timing or (old.paused and not paused):
        try:
            next_at = timing.at_or_after(max(now, old.timing.start_at))
        except (KeyError, ValueError):  # a zone stored earlier, gone from the tz database
            raise errors.InvalidField("timezone", "not in this node's tz database") from None
    return spec, next_at
