"""How a command's parser is made: its help, its description and example, and help text
wrapped to the terminal. ``build_parser`` in ``main`` puts the commands together."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from typing import TypeAlias

# A string: the class is generic only to type checkers.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Formatter(argparse.HelpFormatter):
    """Descriptions and epilogs wrapped to the terminal paragraph by paragraph (one a line);
    indented lines, the examples, are kept as written so that they can be copied."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(
            indent + line
            if line.startswith(" ") or not line
            else textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
            for line in text.splitlines()
        )


def command(
    commands: Commands,
    name: str,
    text: str,
    *,
    example: str | None = None,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> argparse.ArgumentParser:
    """A command whose one-line ``text`` is its help in its parent's list and its description
    on its own page; ``example`` (command lines, one a line) becomes its epilog."""
    return commands.add_parser(
        name,
        help=text,
        description=text[0].upper() + text[1:] + ".",
        epilog=f"example:\n  {example.replace(chr(10), chr(10) + '  ')}" if example else None,
        formatter_class=Formatter,
        parents=list(parents),
    )


def subcommands(parser: argparse.ArgumentParser, dest: str) -> Commands:
    """The commands under ``parser``; the one chosen is ``args.<dest>``."""
    return parser.add_subparsers(dest=dest, required=True, metavar="COMMAND", title="commands")


def group(commands: Commands, name: str, text: str) -> Commands:
    """A command of commands (``dispatcher NAME COMMAND``), chosen as ``args.<name>_command``."""
    return subcommands(command(commands, name, text), f"{name}_command")
