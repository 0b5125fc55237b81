"""The API commands never take a token on the command line (``ps`` shows it to every user): the
key comes from DISPATCHER_API_KEY or ``--api-key-file``, and ``--api-key TOKEN`` is refused with
where to put it instead, without echoing it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dispatcher.cli import credentials
from dispatcher.cli.main import build_parser

TOKEN = "admin-token-0123456789"
COMMANDS = [["stats"], ["jobs", "list"], ["dlq", "requeue", "billing.orders.expire.dead"]]


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("form", ["separate", "joined"])
def test_a_token_on_the_command_line_is_refused_and_not_echoed(
    command: list[str], form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = ["--api-key", TOKEN] if form == "separate" else [f"--api-key={TOKEN}"]
    with pytest.raises(SystemExit) as refused:
        parsed(*command, *flag)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--api-key was removed" in err
    assert "DISPATCHER_API_KEY" in err
    assert "--api-key-file" in err
    assert TOKEN not in err


def test_the_key_comes_from_the_file_before_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCHER_API_KEY", "from-the-environment-0123")
    key_file = tmp_path / "key"
    key_file.write_text(f"{TOKEN}\n")
    for command in COMMANDS:
        assert credentials.token(parsed(*command, "--api-key-file", str(key_file))) == TOKEN
        assert credentials.token(parsed(*command)) == "from-the-environment-0123"
    monkeypatch.delenv("DISPATCHER_API_KEY")
    assert credentials.token(parsed("stats")) is None


@pytest.mark.parametrize(
    ("content", "shown"),
    [
        (None, "cannot read"),
        ("", "must hold one API key"),
        (f"{TOKEN} {TOKEN}x", "must hold one API key"),
    ],
)
def test_a_key_file_that_is_missing_or_not_one_key_is_refused_by_name(
    tmp_path: Path, content: str | None, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content)
    with pytest.raises(SystemExit):
        parsed("stats", "--api-key-file", str(key_file))
    err = capsys.readouterr().err
    assert "argument --api-key-file: " in err
    assert shown in err
    assert str(key_file) in err
    assert TOKEN not in err


def test_help_offers_the_file_and_the_environment_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parsed("stats", "--help")
    text = capsys.readouterr().out
    assert "--api-key-file PATH" in text
    assert "$DISPATCHER_API_KEY" in text
    assert "--api-key " not in text
