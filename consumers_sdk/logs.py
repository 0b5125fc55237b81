"""Log lines as text or as JSON objects, one a line, for log shippers (Loki, Elasticsearch,
CloudWatch). ``configure(json=True)`` is what ``dispatcher-consumer --log-format json`` does; the
dispatcher's ``DISPATCHER_LOG_FORMAT=json`` writes the same objects.

A JSON line holds ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, every
field given in ``extra=`` (``action``, ``job_id``, ...), and ``exception`` (the traceback) when
there is one. JSON escapes every control character, so a value cannot split or forge a line.
"""

from __future__ import annotations

import json as json_mod
import logging
import sys
from datetime import UTC, datetime
from typing import Final

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What every LogRecord has: anything else on a record came in through ``extra=``. uvicorn's
# ``color_message`` is its message again with terminal colours: noise in a JSON line.
_STANDARD: Final = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``message``, the extras."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in line:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json_mod.dumps(line, default=str)


def configure(level: str | int = "INFO", *, json: bool = False) -> None:
    """Send the root logger's records to stderr, as text or (``json=True``) as JSON lines;
    replaces the root logger's handlers, so it is for an application's entry point."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
