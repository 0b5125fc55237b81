"""The API key sent by the commands that call a dispatcher's HTTP API: from
``DISPATCHER_API_KEY`` or a file (``--api-key-file``), never from the command line, where ``ps``
and shell histories show it to every user of the machine (``--api-key`` is refused, saying so)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENV = "DISPATCHER_API_KEY"
REMOVED = (
    "--api-key was removed: a token on the command line shows in ps to every user of the "
    f"machine; set {ENV} or give --api-key-file PATH"
)


def _read(path: str) -> str:
    """The token in the file at PATH, without the line break an editor or ``echo`` adds. Errors
    name the file, never what it holds."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text"
        raise argparse.ArgumentTypeError(f"cannot read {path}: {reason}") from None
    if not token or len(token.split()) != 1:
        raise argparse.ArgumentTypeError(f"{path} must hold one API key and nothing else")
    return token


class _Removed(argparse.Action):
    """``--api-key TOKEN``: refused before anything is sent, saying where the token goes instead."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        parser.error(REMOVED)


def add_options(parser: argparse.ArgumentParser, key: str) -> None:
    """``--api-key-file``; KEY says what key the command needs (``an API key``, ...)."""
    parser.add_argument(
        "--api-key-file",
        type=_read,
        default=None,
        metavar="PATH",
        help=f"a file holding {key} (default: ${ENV}); never on the command line",
    )
    parser.add_argument(
        "--api-key", action=_Removed, nargs="?", dest=argparse.SUPPRESS, help=argparse.SUPPRESS
    )


def token(args: argparse.Namespace) -> str | None:
    """The key to send: the file's, else ``DISPATCHER_API_KEY``'s, else none."""
    from_file: str | None = args.api_key_file
    return from_file or os.environ.get(ENV) or None
