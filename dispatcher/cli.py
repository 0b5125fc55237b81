"""Command line: ``dispatcher serve | migrate``. Parses, builds Settings, calls; no logic here."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from dispatcher import errors, logs
from dispatcher.settings import Settings


def _run(coroutine: Coroutine[Any, Any, object]) -> object:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dispatcher", description="Delay dispatcher")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run a dispatcher node (applies migrations first)")
    commands.add_parser("migrate", help="apply the database migrations and exit")
    args = parser.parse_args(argv)

    settings = Settings()
    logs.setup(settings.log_level)
    try:
        if args.command == "serve":
            from dispatcher import node

            _run(node.serve(settings))
        elif args.command == "migrate":
            from dispatcher.store import migrate

            applied = _run(migrate.apply_migrations(settings.database_url))
            print(f"applied: {', '.join(applied) or 'nothing, up to date'}")  # type: ignore[arg-type]
    except errors.DispatcherError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return 1
    return 0
