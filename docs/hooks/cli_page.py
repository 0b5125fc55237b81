"""The command-line reference: the ``--help`` of every command and subcommand, walked from the
parsers themselves so that a new command appears here by itself."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
from collections.abc import Iterator

import consumers_sdk

WIDTH = "100"  # argparse wraps help to $COLUMNS

INTRO = """\
# Command line

Every command of `dispatcher` (also `python -m dispatcher ...`) with its `--help`. The commands
that talk to the HTTP API take `--url` (or `DISPATCHER_URL`) and an API key from
`DISPATCHER_API_KEY` or a file (`--api-key-file`), never on the command line; the others read the
`DISPATCHER_*` settings ([Configuration](configuration.md)).

This page is generated from the command line's parsers.
"""


def subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser, then each of its subcommands' parsers, depth first."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from subcommands(child)


def parsers() -> list[argparse.ArgumentParser]:
    """The ``dispatcher`` parser, and the SDK's consumer runner's when it has one."""
    # dispatcher.cli re-exports main(), which hides its module of the same name.
    roots = [importlib.import_module("dispatcher.cli.main").build_parser()]
    for name in (f"{consumers_sdk.__name__}.cli", f"{consumers_sdk.__name__}.__main__"):
        if importlib.util.find_spec(name) is None:
            continue  # a module that exists but fails to import fails the build
        module = importlib.import_module(name)
        if hasattr(module, "build_parser"):
            roots.append(module.build_parser())
            break
    return [parser for root in roots for parser in subcommands(root)]


def helps() -> list[tuple[str, str]]:
    """(command, its --help) for every command."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return [(parser.prog, parser.format_help()) for parser in parsers()]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def render() -> str:
    sections = [f"## `{prog}`\n\n```text\n{text.rstrip()}\n```\n" for prog, text in helps()]
    return INTRO + "\n" + "\n".join(sections)
