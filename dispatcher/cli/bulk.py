"""``dispatcher jobs bulk cancel|requeue|reschedule|list|show|stop|resume``: bulk actions through
the HTTP API (``POST /v1/bulk-actions``).

An action first asks for a dry run and shows how many jobs match and the first of them; it then
asks to go on (``--yes`` answers for scripts: without a terminal nothing is changed without it),
starts the action and follows it: a progress bar on a terminal, a plain line every few seconds
otherwise (stderr), and the end on stdout. Ctrl-C stops following, not the action."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from dispatcher.cli import parsers, progress, tables

Row = dict[str, Any]
Check = Callable[[httpx.Response], Any]
PATH = "/v1/bulk-actions"
POLL_S = 0.5
LINE_EVERY_S = 5.0  # without a terminal: a progress line this often
# The filter options: (option, body field, help).
FILTERS = (
    ("--state", "state", "only jobs in this state (scheduled or waiting; dead for requeue)"),
    ("--routing-key", "routing_key", "only jobs of this routing key"),
    ("--routing-key-prefix", "routing_key_prefix", "only jobs of these words or below"),
    ("--run-at-from", "run_at_from", "only jobs due at or after this time (ISO 8601)"),
    ("--run-at-to", "run_at_to", "only jobs due at or before this time (ISO 8601)"),
    ("--finished-from", "finished_from", "requeue: only jobs dead since this time (ISO 8601)"),
    ("--finished-to", "finished_to", "requeue: only jobs dead by this time (ISO 8601)"),
    ("--error-contains", "error_contains", "only jobs whose last error contains this text"),
    ("--namespace", "namespace", "an admin's key: only this namespace ('' the default one)"),
)
ACTIONS = {
    "cancel": ("cancel every scheduled or waiting job the filter matches", "cancelled"),
    "requeue": ("requeue every dead job the filter matches (an admin's key)", "requeued"),
    "reschedule": ("move every scheduled or waiting job the filter matches", "rescheduled"),
}


def add_parsers(jobs: parsers.Commands, common: argparse.ArgumentParser) -> None:
    bulk = parsers.group(jobs, "bulk", "act on every job a filter matches, in the background")
    for name, (text, _) in ACTIONS.items():
        command = parsers.command(
            bulk,
            name,
            text,
            example=f"dispatcher jobs bulk {name} --routing-key-prefix billing"
            + (" --shift 3600" if name == "reschedule" else "")
            + (" --error-contains timeout" if name == "requeue" else ""),
            parents=[common],
        )
        for option, _field, help_text in FILTERS:
            command.add_argument(option, default=None, help=help_text)
        if name == "reschedule":
            command.add_argument("--run-at", default=None, help="every job's new time (ISO 8601)")
            command.add_argument(
                "--shift", type=float, default=None, help="move each job by this many seconds"
            )
        command.add_argument(
            "--dry-run", action="store_true", help="only count and show the first jobs"
        )
        command.add_argument("--yes", action="store_true", help="go on without asking")
        command.add_argument(
            "--no-wait", action="store_true", help="start it and print it, without following"
        )
    parsers.command(bulk, "list", "the bulk actions, newest first", parents=[common])
    for name, text in (
        ("show", "one bulk action and its progress"),
        ("stop", "stop a running bulk action after its batch in flight"),
        ("resume", "resume a stopped or failed bulk action where it stopped"),
    ):
        command = parsers.command(bulk, name, text, parents=[common])
        command.add_argument("id", help="the bulk action's id")


def run(http: httpx.Client, args: argparse.Namespace, check: Check) -> int:
    """One bulk command; ``check`` turns a refused answer into the CLI's error."""
    command = args.bulk_command
    if command == "list":
        found = check(http.get(PATH))["bulk_actions"]
        return _print(args, found, _actions_table)
    if command in ("show", "stop", "resume"):
        path = f"{PATH}/{quote(args.id, safe='')}"
        action = check(http.get(path) if command == "show" else http.post(f"{path}/{command}"))
        return _print(args, action, _action_table)
    return _act(http, args, check)


def _act(http: httpx.Client, args: argparse.Namespace, check: Check) -> int:
    body = _body(args)
    dry = check(http.post(PATH, json={**body, "dry_run": True}))
    matched = dry["matched"]
    if args.json and args.dry_run:
        print(json.dumps(dry))
        return 0
    print(f"{matched} jobs match: {args.bulk_command} them", file=sys.stderr)
    if dry["sample"]:
        print(_sample_table(dry["sample"]), file=sys.stderr)
    if args.dry_run or matched == 0:
        return 0
    if not args.yes and not _confirmed(f"{args.bulk_command} these {matched} jobs?"):
        print("nothing changed", file=sys.stderr)
        return 1
    action = check(http.post(PATH, json=body))
    if args.no_wait:
        return _print(args, action, _action_table)
    try:
        action = _follow(http, action, check)
    except KeyboardInterrupt:
        print(
            f"\nno longer following; the action goes on: dispatcher jobs bulk stop {action['id']}",
            file=sys.stderr,
        )
        return 130
    if args.json:
        print(json.dumps(action))
    else:
        print(
            f"{action['status']}: {action['touched']} jobs {ACTIONS[args.bulk_command][1]}"
            f" (bulk action {action['id']})"
        )
    return 0 if action["status"] == "done" else 1


def _body(args: argparse.Namespace) -> Row:
    given = {field: getattr(args, field) for _, field, _ in FILTERS}
    body: Row = {
        "action": args.bulk_command,
        "filter": {field: value for field, value in given.items() if value is not None},
    }
    if args.bulk_command == "reschedule":
        if args.run_at is not None:
            body["run_at"] = args.run_at
        if args.shift is not None:
            body["shift_s"] = args.shift
    return body


def _confirmed(question: str) -> bool:
    """Asked on a terminal only: a script without ``--yes`` changes nothing."""
    if not sys.stdin.isatty():
        print("not a terminal: pass --yes to go on", file=sys.stderr)
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _follow(http: httpx.Client, action: Row, check: Check) -> Row:
    """Poll the action until it ends: a bar on a terminal, a line now and then otherwise."""
    path = f"{PATH}/{quote(action['id'], safe='')}"
    last_line = time.monotonic()
    with progress.bar() as drawn:
        while action["status"] == "running":
            time.sleep(POLL_S)
            action = check(http.get(path))
            total = max(action["matched_estimate"], action["touched"])
            if drawn.enabled:
                drawn(action["touched"], total)
            elif time.monotonic() - last_line >= LINE_EVERY_S:
                last_line = time.monotonic()
                print(f"{action['touched']}/{total} jobs", file=sys.stderr)
    return action


def _print(args: argparse.Namespace, data: Any, render: Callable[[Any], str]) -> int:
    print(json.dumps(data) if args.json else render(data))
    return 0


def _sample_table(jobs: list[Row]) -> str:
    return tables.table(
        [(j["id"], j["state"], j["routing_key"], j["run_at"], j.get("last_error")) for j in jobs],
        ["id", "state", "routing key", "run at", "error"],
    )


def _actions_table(actions: list[Row]) -> str:
    return tables.table(
        [
            (
                a["id"],
                a["action"],
                a["status"],
                f"{a['touched']}/{a['matched_estimate']}",
                a["created_by"],
                a["created_at"],
            )
            for a in actions
        ],
        ["id", "action", "status", "touched", "by", "created"],
    )


def _action_table(action: Row) -> str:
    return tables.table([(name, action.get(name)) for name in action], ["field", "value"])
