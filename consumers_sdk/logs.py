"""Log lines as text or as JSON objects, one a line, for log shippers (Loki, Elasticsearch,
CloudWatch). ``configure(json=True)`` is what ``dispatcher-consumer --log-format json`` does; the
dispatcher's ``DISPATCHER_LOG_FORMAT=json`` writes the same objects.

A JSON line holds ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, every
field given in ``extra=`` (``action``, ``job_id``, ...), and ``exception`` (the traceback) when
there is one. JSON escapes every control character, so a value cannot split or forge a line.

A text line is one line too: ``TextFormatter`` escapes control characters in the message and in
the traceback, which follows the message on the same line (``\\n`` between its lines). A
newline in an exception's text (user input in a ``ValueError``) cannot start a line that looks
like another record.
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


def _escapes() -> dict[int, str]:
    # C0, DEL and C1 controls, and the line and paragraph separators some viewers break lines on.
    table = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
    table.update({0x2028: "\\u2028", 0x2029: "\\u2029"})
    table.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
    return table


ESCAPES: Final = _escapes()


def escape(text: str) -> str:
    """``text`` without control characters: ``\\n`` becomes ``\\\\n``, the others ``\\\\xNN`` or
    ``\\\\uNNNN``."""
    return text.translate(ESCAPES)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` lines, one per record: the message, the traceback and the stack escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        # ``format`` sets record.message from the arguments just before, on every call.
        record.message = escape(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        # logging.Formatter.format, with the traceback joined by a space rather than a newline.
        # record.exc_text stays the plain traceback: other handlers (pytest's) share the record.
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += " " + escape(record.exc_text)
        if record.stack_info:
            line += " " + escape(self.formatStack(record.stack_info))
        return line


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
    handler.setFormatter(JsonFormatter() if json else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
