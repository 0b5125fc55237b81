"""Recurring schedules' rules, defined once for the dispatcher (``dispatcher.api.schedule_schemas``,
``dispatcher.recurring``) and the SDK's in-memory fake (``testing.memory_api``): what a name may
be, the defaults of a new schedule, and how many occurrences ``GET /v1/schedules/{name}`` shows.
Pure."""

from __future__ import annotations

import re
from typing import Final

NAME_PATTERN: Final = r"^[A-Za-z0-9_.:\-]+$"
MAX_NAME_LENGTH: Final = 128
UPCOMING: Final = 5  # occurrences shown by GET /v1/schedules/{name}
DEFAULT_GRACE_S: Final = 60.0  # an occurrence later than this is missed
DEFAULT_TIMEZONE: Final = "UTC"  # of a cron expression
DEFAULT_MISSED: Final = "latest"  # of the occurrences missed during downtime, fire the latest

_NAME: Final = re.compile(NAME_PATTERN)


def name_problem(name: str) -> str | None:
    """What is wrong with a schedule's name (the node's pydantic ``Name`` checks the same)."""
    if not 1 <= len(name) <= MAX_NAME_LENGTH or not _NAME.fullmatch(name):
        return f"1-{MAX_NAME_LENGTH} of A-Z a-z 0-9 _ . : -"
    return None
