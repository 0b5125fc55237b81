"""JSON log lines (``DISPATCHER_LOG_FORMAT=json``, the SDK's ``logs.configure(json=True)`` and the
runner's ``--log-format json``): one object a line with ts, level, logger, message and extras."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from consumers_sdk import __main__ as runner
from consumers_sdk import logs as sdk_logs
from dispatcher.settings import Settings

ROOT = Path(__file__).parents[2]


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("dispatcher.firing", logging.ERROR, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    return made


def test_a_json_line_holds_ts_level_logger_message_and_the_extras() -> None:
    line = sdk_logs.JsonFormatter().format(
        record("job %s parked\nINFO forged", "j1", action="park", job_id="j1")
    )
    assert line.splitlines() == [line]
    fields = json.loads(line)
    assert fields["level"] == "ERROR"
    assert fields["logger"] == "dispatcher.firing"
    assert fields["message"] == "job j1 parked\nINFO forged"  # escaped by JSON, not cut
    assert (fields["action"], fields["job_id"]) == ("park", "j1")
    assert fields["ts"].endswith("Z")
    assert datetime.fromisoformat(fields["ts"].replace("Z", "+00:00")).tzinfo is not None
    assert "args" not in fields
    assert "msg" not in fields


def test_a_traceback_is_a_field_of_the_same_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record("failed")
        failed.exc_info = sys.exc_info()
    line = sdk_logs.JsonFormatter().format(failed)
    assert len(line.splitlines()) == 1
    assert json.loads(line)["exception"].endswith("ValueError: boom")


def test_an_extra_that_is_not_json_is_written_as_text() -> None:
    fields = json.loads(sdk_logs.JsonFormatter().format(record("x", shards={7})))
    assert fields["shards"] == "{7}"


def logged(setup: str) -> list[str]:
    """The stderr lines of a fresh interpreter that runs ``setup`` and then logs: the root
    logger's handlers are its own, not the test session's."""
    script = f"""
import logging
{setup}
firing = logging.getLogger("dispatcher.firing")
firing.warning("firing paused %.1fs", 1.5, extra={{"action": "fire"}})
logging.getLogger("dispatcher.node").debug("not at INFO")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_the_dispatcher_writes_json_lines_when_its_setting_says_json() -> None:
    [line] = logged("from dispatcher import logs\nlogs.setup('INFO', 'json')")
    fields = json.loads(line)
    assert (fields["message"], fields["action"]) == ("firing paused 1.5s", "fire")
    assert (fields["level"], fields["logger"]) == ("WARNING", "dispatcher.firing")


def test_the_dispatcher_writes_text_by_default() -> None:
    [line] = logged("from dispatcher import logs\nlogs.setup('INFO')")
    assert line.endswith("WARNING dispatcher.firing: firing paused 1.5s action=fire")


def test_the_log_format_setting_is_text_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISPATCHER_LOG_FORMAT", raising=False)
    assert Settings().log_format == "text"
    monkeypatch.setenv("DISPATCHER_LOG_FORMAT", "json")
    assert Settings().log_format == "json"
    monkeypatch.setenv("DISPATCHER_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError, match="log_format"):
        Settings()


def test_the_sdk_configures_json_lines_for_an_application() -> None:
    [line] = logged("from consumers_sdk import logs\nlogs.configure('info', json=True)")
    fields = json.loads(line)
    assert (fields["message"], fields["action"]) == ("firing paused 1.5s", "fire")
    assert fields["ts"].endswith("Z")


def test_the_runner_takes_a_log_format_flag() -> None:
    assert runner.build_parser().parse_args(["a:b", "--log-format", "json"]).log_format == "json"
    assert runner.build_parser().parse_args(["a:b"]).log_format == "text"
    with pytest.raises(SystemExit):
        runner.build_parser().parse_args(["a:b", "--log-format", "xml"])
