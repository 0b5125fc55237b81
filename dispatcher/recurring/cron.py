"""Five-field cron expressions (minute hour day-of-month month day-of-week) and the next matching
wall-clock minute. Pure: no clock, no zone; ``occurrences`` maps wall-clock times to instants.

Each field takes ``*``, numbers, ranges ``a-b``, steps ``*/n``, ``a-b/n`` and ``a/n`` (``a`` to the
field's end), and comma lists of those; months ``jan``-``dec`` and days ``sun``-``sat`` by name
(day 0 and 7 are both Sunday). ``@yearly``, ``@monthly``, ``@weekly``, ``@daily`` and ``@hourly``
stand for their usual expressions. As in Vixie cron, when both day-of-month and day-of-week are
restricted (neither starts with ``*``) a day matches if either does; otherwise both must.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import MAXYEAR, datetime, timedelta

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Every calendar pattern repeats within 28 years (leap years and weekdays); a search past that
# never finds a match.
SEARCH_YEARS = 29


class CronError(ValueError):
    """The expression is not a valid five-field cron expression."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    name_base: int = 0


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, MONTHS, 1),
    _Field("day of week", 0, 7, DAYS, 0),
)


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed expression: the allowed values of each field."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    day_star: bool  # day-of-month started with '*' (unrestricted for the OR rule)
    weekday_star: bool

    def day_matches(self, year: int, month: int, day: int) -> bool:
        in_month = day in self.days
        weekday = (calendar.weekday(year, month, day) + 1) % 7  # Monday=0 -> Sunday=0
        on_weekday = weekday in self.weekdays
        if self.day_star or self.weekday_star:
            return in_month and on_weekday
        return in_month or on_weekday

    def next_after(self, after: datetime) -> datetime | None:
        """The first wall-clock minute strictly after ``after`` (naive) that matches, or None when
        none does within ``SEARCH_YEARS`` (an impossible date such as 30 February)."""
        moment = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = after.year + SEARCH_YEARS
        while moment.year <= limit:
            if moment.month not in self.months:
                following = _first_of_next_month(moment)
                if following is None:
                    return None  # past the year 9999 that datetime ends with
                moment = following
            elif not self.day_matches(moment.year, moment.month, moment.day):
                moment = moment.replace(hour=0, minute=0) + timedelta(days=1)
            elif moment.hour not in self.hours:
                moment = moment.replace(minute=0) + timedelta(hours=1)
            elif moment.minute not in self.minutes:
                moment += timedelta(minutes=1)
            else:
                return moment
        return None


def _first_of_next_month(moment: datetime) -> datetime | None:
    if moment.month == 12:
        return datetime(moment.year + 1, 1, 1) if moment.year < MAXYEAR else None
    return datetime(moment.year, moment.month + 1, 1)


def parse(expression: str) -> Cron:
    """Parse an expression; CronError says which field is wrong and why."""
    text = MACROS.get(expression.strip().lower(), expression)
    parts = text.split()
    if len(parts) != len(_FIELDS):
        raise CronError(
            f"needs 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}"
        )
    values = [_parse_field(part, spec) for part, spec in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(day % 7 for day in values[4])
    cron = Cron(
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=weekdays,
        day_star=parts[2].startswith("*"),
        weekday_star=parts[4].startswith("*"),
    )
    if cron.next_after(datetime(2000, 1, 1)) is None:
        raise CronError("matches no date (day of month never falls in the months given)")
    return cron


def _parse_field(text: str, spec: _Field) -> frozenset[int]:
    values: set[int] = set()
    for item in text.lower().split(","):
        values.update(_parse_item(item, spec))
    return frozenset(values)


def _parse_item(item: str, spec: _Field) -> range:
    where = f"{spec.name} {item!r}"
    span, _, step_text = item.partition("/")
    step = 1
    if step_text:
        if not _is_number(step_text) or int(step_text) == 0:
            raise CronError(f"{where}: the step must be a positive number")
        step = int(step_text)
    if span == "*":
        low, high = spec.low, spec.high
    elif "-" in span:
        first, _, last = span.partition("-")
        low, high = _value(first, spec, where), _value(last, spec, where)
        if low > high:
            raise CronError(f"{where}: the range runs backwards")
    else:
        low = _value(span, spec, where)
        high = spec.high if step_text else low
    return range(low, high + 1, step)


def _value(text: str, spec: _Field, where: str) -> int:
    if text in spec.names:
        return spec.names.index(text) + spec.name_base
    if not _is_number(text):
        raise CronError(f"{where}: {text!r} is not a number or a name")
    value = int(text)
    if not spec.low <= value <= spec.high:
        raise CronError(f"{where}: {value} is outside {spec.low}-{spec.high}")
    return value


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()
