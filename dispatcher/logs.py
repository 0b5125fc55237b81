"""Logging setup. Records may carry ``extra={"action": ..., "job_id": ...}``; both are printed."""

from __future__ import annotations

import logging
import sys


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        for key in ("action", "job_id"):
            value = record.__dict__.get(key)
            if value is not None:
                line += f" {key}={value}"
        return line


def setup(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
    logging.getLogger("aiormq").setLevel(logging.WARNING)
