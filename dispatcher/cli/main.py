"""Command line: ``dispatcher serve | migrate | keys | dlq | broker | jobs | schedules | limits |
cluster | stats``. Parses, builds Settings, calls; no logic (the HTTP API's commands are in
``cli.http``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import faulthandler
import json
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from dispatcher import errors, logs
from dispatcher.auth import api_keys
from dispatcher.cli import credentials, http, parsers, progress, tables
from dispatcher.settings import Settings
from dispatcher.version import __version__

if TYPE_CHECKING:
    from consumers_sdk import dlq as sdk_dlq


def _run(coroutine: Coroutine[Any, Any, object]) -> object:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency but on Windows (pyproject.toml)
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from dispatcher.store import migrate

    if not args.status:
        applied = _run(migrate.apply_migrations(settings.database_url))
        print(f"applied: {', '.join(applied) or 'nothing, up to date'}")  # type: ignore[arg-type]
        return 0
    lines = _run(migrate.read_status(settings.database_url))
    assert isinstance(lines, list)
    for line in lines:
        applied_at = line.applied_at.isoformat(timespec="seconds") if line.applied_at else "-"
        print(f"{line.version:<40} {line.state:<12} {applied_at}")
    # Anything but applied or pending keeps a node of this release from starting.
    return 1 if any(line.state not in ("applied", "pending") for line in lines) else 0


def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    from consumers_sdk import dlq, errors, topology

    try:
        if args.dlq_command == "list":
            queues = asyncio.run(dlq.list_dead(settings.amqp_url, settings.amqp_management_url))
        elif args.job is not None:
            routing_key = asyncio.run(
                dlq.requeue_job(settings.amqp_url, args.queue, args.job, exchange=settings.exchange)
            )
            print(f"requeued job {args.job} from {args.queue} to routing key {routing_key}")
            return 0
        else:
            with progress.bar() as drawn:
                done = asyncio.run(_dlq_requeue(args, settings, drawn))
    except errors.DlqError as exc:
        print(f"dispatcher dlq: {exc}", file=sys.stderr)
        return 1
    if args.dlq_command == "requeue":
        print(f"requeued {done.moved} jobs from {args.queue} to {dlq.work_queue_of(args.queue)}")
        if args.queue != topology.EVENTS_DEAD_QUEUE:  # job events: no job to ask about
            hint = "" if done.checked else "; give --url or DISPATCHER_URL to drop stale ones"
            print(f"{done.dropped_text()}{hint}")
    elif args.json:
        print(json.dumps([dataclasses.asdict(queue) for queue in queues]))
    else:
        rows = [
            # "?": the broker cannot say
            (queue.name, "?" if queue.messages is None else queue.messages, queue.work_queue)
            for queue in queues
        ]
        print(tables.table(rows, ["dead-letter queue", "messages", "work queue"]))
    return 0


async def _dlq_requeue(
    args: argparse.Namespace, settings: Settings, drawn: progress.Bar
) -> sdk_dlq.Requeued:
    from consumers_sdk import dlq, dlq_check

    if not args.url:  # nothing to ask: every copy moves, as before the check
        return await dlq.requeue(settings.amqp_url, args.queue, limit=args.limit, progress=drawn)
    async with dlq_check.JobLookup(args.url, api_key=credentials.token(args)) as lookup:
        return await dlq.requeue(
            settings.amqp_url, args.queue, limit=args.limit, progress=drawn, lookup=lookup
        )


def _broker(args: argparse.Namespace, settings: Settings) -> int:
    from consumers_sdk import errors, policies

    try:
        version, applied = asyncio.run(
            policies.apply(
                settings.amqp_url,
                settings.amqp_management_url,
                dry_run=args.dry_run,
                priority=args.priority,
            )
        )
    except errors.DlqError as exc:
        print(f"dispatcher broker: {exc}", file=sys.stderr)
        return 1
    verb = "would apply" if args.dry_run else "applied"
    for policy in applied:
        print(
            f"{verb} policy {policy.name} (pattern {policy.pattern!r}, priority "
            f"{policy.priority}) on RabbitMQ {version}: {json.dumps(policy.definition)}"
        )
    return 0


async def _keys(args: argparse.Namespace, settings: Settings) -> int:
    from dispatcher.store.api_keys import KeyStore
    from dispatcher.store.db import Database

    db = Database(settings.database_url, min_size=1, max_size=1, timeout_s=settings.db_timeout_s)
    await db.open()
    try:
        store = KeyStore(db)
        if args.keys_command == "create":
            try:
                key, token = await store.create(
                    scope=api_keys.Scope(args.scope),
                    namespace=args.namespace,
                    routing_key_prefixes=args.routing_key_prefix,
                    name=args.name,
                )
            except ValueError as exc:
                print(f"dispatcher keys: {exc}", file=sys.stderr)
                return 2
            # The description goes to stderr so that `TOKEN=$(dispatcher keys create ...)` works.
            print(f"created key {key.id}; the token is shown this once:", file=sys.stderr)
            print(token)
        elif args.keys_command == "list":
            listed = await store.list()
            if args.json:
                print(json.dumps([_key_view(key) for key in listed]))
            else:
                print(_keys_table(listed))
        elif not await store.revoke(args.id):
            print(f"dispatcher keys: no live key {args.id}", file=sys.stderr)
            return 1
        else:
            print(f"revoked key {args.id}")
    finally:
        await db.close()
    return 0


def _key_view(key: api_keys.ApiKey) -> dict[str, object]:
    """What ``keys list`` shows: everything but the hash."""
    return {
        "id": key.id,
        "scope": key.scope.value,
        "namespace": key.namespace,
        "routing_key_prefixes": list(key.routing_key_prefixes),
        "name": key.name,
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def _keys_table(keys: list[api_keys.ApiKey]) -> str:
    rows = [
        (
            key.id,
            key.scope.value,
            key.namespace,
            ",".join(key.routing_key_prefixes) or "*",  # "*": no prefix, any routing key
            key.name,
            key.created_at.isoformat(timespec="seconds"),
            key.revoked_at.isoformat(timespec="seconds") if key.revoked_at else None,
        )
        for key in keys
    ]
    header = ["id", "scope", "namespace", "prefixes", "name", "created", "revoked"]
    return tables.table(rows, header)


def _keys_parser(commands: parsers.Commands) -> None:
    keys_commands = parsers.group(commands, "keys", "API keys, stored in PostgreSQL")
    create = parsers.command(
        keys_commands,
        "create",
        "create a key and print its token once (on stdout, alone)",
        example="TOKEN=$(dispatcher keys create --scope producer \\\n"
        "    --namespace billing --routing-key-prefix billing. \\\n"
        "    --name 'billing service')",
    )
    create.add_argument(
        "--scope",
        required=True,
        choices=[scope.value for scope in api_keys.Scope],
        help="producer: its namespace's jobs; monitor: probes and metrics; limits: pause and"
        " resume its namespace's routing keys; admin: everything",
    )
    create.add_argument(
        "--namespace", default=None, help="producer and limits keys: the key's namespace"
    )
    create.add_argument(
        "--routing-key-prefix",
        action="append",
        default=[],
        help="producer and limits keys: allowed routing-key prefix (repeat for several; none: any)",
    )
    create.add_argument("--name", default="", help="a label for humans, shown by 'keys list'")
    listing = parsers.command(keys_commands, "list", "every key, revoked ones too; no secrets")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    revoke = parsers.command(
        keys_commands,
        "revoke",
        "revoke a key (refused by every node at once)",
        example="dispatcher keys revoke 7",
    )
    revoke.add_argument("id", type=int, help="the key's id, as 'keys list' shows it")


def _dlq_parser(commands: parsers.Commands) -> None:
    dlq = parsers.group(commands, "dlq", "dead-letter queues of the consumers")
    dlq_list = parsers.command(dlq, "list", "the dead-letter queues and their message counts")
    dlq_list.add_argument("--json", action="store_true", help="machine-readable output")
    dlq_requeue = parsers.command(
        dlq,
        "requeue",
        "move dead jobs back to their work queue (a progress bar on a terminal)",
        example="dispatcher dlq requeue billing.orders.expire.dead --limit 100\n"
        "dispatcher dlq requeue billing.orders.expire.dead --job 0f3c...",
    )
    dlq_requeue.add_argument("queue", help="a dead-letter queue, e.g. billing.orders.expire.dead")
    dlq_requeue.add_argument("--limit", type=int, default=None, help="move at most this many")
    dlq_requeue.add_argument(
        "--job",
        default=None,
        help="only this job (id), back to its original routing key with its attempt history",
    )
    dlq_requeue.add_argument(
        "--url",
        default=os.environ.get("DISPATCHER_URL"),
        help="the dispatcher's API, asked about each dead copy: one whose job was requeued or "
        "finished since is dropped, not run again (default: $DISPATCHER_URL; none: no check)",
    )
    credentials.add_options(dlq_requeue, "an API key that sees the jobs' namespaces")


def _broker_parser(commands: parsers.Commands) -> None:
    broker_commands = parsers.group(commands, "broker", "RabbitMQ settings of the project's queues")
    apply = parsers.command(
        broker_commands,
        "apply-policies",
        "give queues an earlier release declared this release's delivery limits (policies)",
        example="dispatcher broker apply-policies --dry-run",
    )
    apply.add_argument("--dry-run", action="store_true", help="print the policies; write nothing")
    apply.add_argument(
        "--priority",
        type=int,
        default=0,
        help="policy priority: above the vhost's own policies (a queue follows only one)",
    )


def build_parser() -> argparse.ArgumentParser:
    """Every command and option of ``dispatcher``; the docs' CLI reference walks it too."""
    parser = argparse.ArgumentParser(
        prog="dispatcher",
        description="Run and operate a delay dispatcher: serve a node, migrate its database, "
        "manage API keys and dead letters, look at the jobs, schedules and cluster behind a "
        "node's HTTP API, and hold a routing key's jobs back.",
        epilog="Settings come from DISPATCHER_* environment variables (DISPATCHER_DATABASE_URL, "
        "DISPATCHER_AMQP_URL, ...). 'dispatcher COMMAND --help' shows a command's options.",
        formatter_class=parsers.Formatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"dispatcher {__version__}", help="print the release"
    )
    commands = parsers.subcommands(parser, "command")
    parsers.command(
        commands,
        "serve",
        "run a dispatcher node (applies migrations first) until SIGTERM",
        example="DISPATCHER_DATABASE_URL=postgresql://... dispatcher serve",
    )
    migrate = parsers.command(commands, "migrate", "apply the database migrations and exit")
    migrate.add_argument(
        "--status",
        action="store_true",
        help="list the shipped and applied migrations and change nothing",
    )
    _keys_parser(commands)
    _dlq_parser(commands)
    _broker_parser(commands)
    http.add_parsers(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    settings = Settings()
    logs.setup(settings.log_level, settings.log_format)
    try:
        if args.command == "serve":
            # `kill -USR1 PID` writes every thread's stack to stderr and the node runs on: where a
            # node that never gets ready is waiting (devstack asks for it then). SIGUSR2 (what
            # each task awaits) is ignored until the node's loop answers it.
            faulthandler.register(signal.SIGUSR1, all_threads=True)
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
            from dispatcher import node

            _run(node.serve(settings))
        elif args.command == "migrate":
            return _migrate(args, settings)
        elif args.command == "keys":
            code = _run(_keys(args, settings))
            assert isinstance(code, int)
            return code
        elif args.command == "dlq":
            return _dlq(args, settings)
        elif args.command == "broker":
            return _broker(args, settings)
        else:
            return http.run(args, f"http://{settings.http_host}:{settings.http_port}")
    except errors.DispatcherError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return 1
    return 0
