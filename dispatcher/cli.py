"""Command line: ``dispatcher serve | migrate | dlq``. Parses, builds Settings, calls; no logic."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
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


def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    from consumers_sdk import dlq, errors

    try:
        if args.dlq_command == "list":
            queues = asyncio.run(dlq.list_dead(settings.amqp_url, settings.amqp_management_url))
        else:
            moved = asyncio.run(dlq.requeue(settings.amqp_url, args.queue, limit=args.limit))
    except errors.DlqError as exc:
        print(f"dispatcher dlq: {exc}", file=sys.stderr)
        return 1
    if args.dlq_command == "requeue":
        print(f"requeued {moved} jobs from {args.queue} to {dlq.work_queue_of(args.queue)}")
    elif args.json:
        print(json.dumps([dataclasses.asdict(queue) for queue in queues]))
    else:
        print(f"{'dead-letter queue':50} {'messages':>9}  work queue")
        for queue in queues:
            print(f"{queue.name:50} {queue.messages:>9}  {queue.work_queue}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dispatcher", description="Delay dispatcher")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run a dispatcher node (applies migrations first)")
    commands.add_parser("migrate", help="apply the database migrations and exit")
    dlq = commands.add_parser("dlq", help="dead-letter queues of the consumers").add_subparsers(
        dest="dlq_command", required=True
    )
    dlq_list = dlq.add_parser("list", help="the dead-letter queues and their message counts")
    dlq_list.add_argument("--json", action="store_true", help="machine-readable output")
    dlq_requeue = dlq.add_parser("requeue", help="move dead jobs back to their work queue")
    dlq_requeue.add_argument("queue", help="a dead-letter queue, e.g. billing.orders.expire.dead")
    dlq_requeue.add_argument("--limit", type=int, default=None, help="move at most this many")
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
        elif args.command == "dlq":
            return _dlq(args, settings)
    except errors.DispatcherError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return 1
    return 0
