"""What a person reads: every command and option of ``dispatcher`` and of the consumer runner
has help, and every command says what it does on its own page."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from consumers_sdk import __main__ as runner
from dispatcher.cli.main import build_parser


def commands(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from commands(child, f"{path} {name}")


def undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest for choice in action._choices_actions if choice.help}
            missing += [f"{path} {name}" for name in action.choices if name not in listed]
        elif not action.help:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    if not parser.description:
        missing.append(f"{path} (description)")
    return missing


PARSERS = [("dispatcher", build_parser()), ("dispatcher-consumer", runner.build_parser())]


@pytest.mark.parametrize(("name", "parser"), PARSERS, ids=[name for name, _ in PARSERS])
def test_every_command_and_option_has_help(name: str, parser: argparse.ArgumentParser) -> None:
    walked = list(commands(parser, name))
    assert len(walked) > (20 if name == "dispatcher" else 0)
    assert [line for path, child in walked for line in undocumented(child, path)] == []


def test_the_walk_finds_an_option_without_help() -> None:
    parser = argparse.ArgumentParser(prog="p", description="d")
    sub = parser.add_subparsers().add_parser("x", help="an x", description="X.")
    sub.add_argument("--quiet", action="store_true")
    assert undocumented(sub, "p x") == ["p x --quiet"]
    bare = argparse.ArgumentParser(prog="q")
    bare.add_subparsers().add_parser("y")
    assert undocumented(bare, "q") == ["q y", "q (description)"]


def test_every_schedules_command_is_there() -> None:
    walked = dict(commands(build_parser(), "dispatcher"))
    assert {
        f"dispatcher schedules {c}" for c in ("list", "show", "pause", "resume", "delete")
    } <= set(walked)
    assert "example:" in (walked["dispatcher schedules pause"].epilog or "")


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    for parser in (build_parser(), runner.build_parser()):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["--version"])
        assert exited.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("dispatcher ")
    assert out[1].startswith("dispatcher-consumer ")
