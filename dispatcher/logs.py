"""Logging setup. Records may carry ``extra={"action": ..., "job_id": ...}``; both are printed.
With ``DISPATCHER_LOG_FORMAT=json`` each line is a JSON object instead (the SDK's
``consumers_sdk.logs.JsonFormatter``: ``ts``, ``level``, ``logger``, ``message``, the extras).

A log line is one line: control characters in the message and the extras (a request's path, a
routing key, a consumer's reason) are escaped, so a caller cannot forge or split a line.
"""

from __future__ import annotations

import logging
import sys

from consumers_sdk import logs as sdk_logs

EXTRAS = ("action", "job_id")


def _escapes() -> dict[int, str]:
    # C0, DEL and C1 controls, and the line and paragraph separators some viewers break lines on.
    table = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
    table.update({0x2028: "\\u2028", 0x2029: "\\u2029"})
    table.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
    return table


ESCAPES = _escapes()


def escape(text: str) -> str:
    """``text`` without control characters: ``\\n`` becomes ``\\\\n``, the others ``\\\\xNN`` or
    ``\\\\uNNNN``."""
    return text.translate(ESCAPES)


class Formatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        # ``format`` sets record.message from the arguments just before, on every call.
        record.message = escape(record.message)
        line = super().formatMessage(record)
        for key in EXTRAS:
            value = record.__dict__.get(key)
            if value is not None:
                line += f" {key}={escape(str(value))}"
        return line


def setup(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        sdk_logs.JsonFormatter() if log_format == "json" else Formatter(sdk_logs.TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
    logging.getLogger("aiormq").setLevel(logging.WARNING)
