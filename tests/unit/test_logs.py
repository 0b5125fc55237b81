"""Log lines cannot be forged: control characters in messages, extras and tracebacks are escaped,
in the dispatcher's lines and in the SDK's text lines."""

from __future__ import annotations

import logging
import sys

import pytest

from consumers_sdk import logs as sdk_logs
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


FORGED = "bad input\n2024-01-01 00:00:00,000 INFO dispatcher.api: forged\u2028line"


def failed_record(name: str = "dispatcher.firing") -> logging.LogRecord:
    """An ERROR record whose exception's text holds a newline and a fake log line's prefix."""
    try:
        raise ValueError(FORGED)
    except ValueError:
        record = logging.LogRecord(name, logging.ERROR, __file__, 1, "job %s failed", ("j1",), None)
        record.exc_info = sys.exc_info()
    return record


def assert_one_line_with_the_traceback(line: str) -> None:
    assert line.splitlines() == [line]
    assert "\\nTraceback (most recent call last):\\n" not in line  # follows on the same line
    assert " Traceback (most recent call last):\\n  File " in line
    assert line.endswith(
        "ValueError: bad input\\n2024-01-01 00:00:00,000 INFO dispatcher.api: forged\\u2028line"
    )


def test_a_traceback_is_escaped_onto_the_records_line() -> None:
    record = failed_record()
    record.__dict__["action"] = "fire"
    line = logs.Formatter(sdk_logs.TEXT_FORMAT).format(record)
    assert " ERROR dispatcher.firing: job j1 failed action=fire Traceback" in line
    assert_one_line_with_the_traceback(line)
    # The record keeps its plain traceback for the other handlers that format it.
    assert record.exc_text is not None
    assert "\n2024-01-01" in record.exc_text


def test_a_stack_is_escaped_onto_the_records_line_too() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "here", (), None, sinfo="a\nb")
    assert logs.Formatter("%(message)s").format(record) == "here a\\nb"


def test_the_sdks_text_lines_escape_the_message_and_the_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        sdk_logs.configure("info")
        logging.getLogger("consumers_sdk.consumer").info("refused %s", FORGED)
        logging.getLogger("consumers_sdk.consumer").handle(failed_record("consumers_sdk.consumer"))
    finally:
        root.handlers[:], root.level = handlers, level
    refused, failed = capsys.readouterr().err.splitlines()
    assert refused.endswith(
        "INFO consumers_sdk.consumer: refused bad input\\n2024-01-01 00:00:00,000 INFO "
        "dispatcher.api: forged\\u2028line"
    )
    assert " ERROR consumers_sdk.consumer: job j1 failed Traceback" in failed
    assert_one_line_with_the_traceback(failed)
