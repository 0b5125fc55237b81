"""Log lines cannot be forged: control characters in messages and extras are escaped."""

from __future__ import annotations

import logging
import sys

import pytest

from dispatcher import logs


def formatted(message: str, *args: object, **extra: object) -> str:
    record = logging.LogRecord("dispatcher.api", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return logs.Formatter("%(levelname)s %(name)s: %(message)s").format(record)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\r\\nb"),
        ("a\tb", "a\\tb"),
        ("a\x00b\x1bc", "a\\x00b\\x1bc"),
        ("a\x7fb", "a\\x7fb"),
        ("a\x85b\x9fc", "a\\x85b\\x9fc"),
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),
        ("plain é ✓ \\n", "plain é ✓ \\n"),
    ],
)
def test_control_characters_are_escaped(raw: str, shown: str) -> None:
    assert logs.escape(raw) == shown


def test_a_message_argument_cannot_start_a_new_line() -> None:
    line = formatted("refused %s", "/v1/jobs/x\nINFO dispatcher: forged\u2028and\x85more")
    assert line == (
        "INFO dispatcher.api: refused /v1/jobs/x\\nINFO dispatcher: forged\\u2028and\\x85more"
    )
    assert line.splitlines() == [line]


def test_extras_are_escaped_too() -> None:
    line = formatted("fired", action="fire\r\nINFO x", job_id="id\u2029y")
    assert line == "INFO dispatcher.api: fired action=fire\\r\\nINFO x job_id=id\\u2029y"


def test_a_traceback_still_follows_on_its_own_lines() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed\n", (), None)
        record.exc_info = sys.exc_info()
    line = logs.Formatter("%(message)s").format(record)
    assert line.startswith("failed\\n\nTraceback")
    assert line.endswith("ValueError: boom")
