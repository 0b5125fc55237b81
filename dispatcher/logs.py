"""Logging setup. Records may carry ``extra={"action": ..., "job_id": ...}``; both are printed.
With ``DISPATCHER_LOG_FORMAT=json`` each line is a JSON object instead (the SDK's
``consumers_sdk.logs.JsonFormatter``: ``ts``, ``level``, ``logger``, ``message``, the extras).

A log line is one line: control characters in the message, the extras (a request's path, a
routing key, a consumer's reason) and a traceback are escaped, so a caller cannot forge or split
a line (the SDK's ``TextFormatter``; the traceback follows the extras on the same line).
"""

from __future__ import annotations

import logging
import sys

from consumers_sdk import logs as sdk_logs

EXTRAS = ("action", "job_id")
escape = sdk_logs.escape


class Formatter(sdk_logs.TextFormatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
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
