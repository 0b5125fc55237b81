"""The commands that talk to a dispatcher's HTTP API with an API key: ``jobs list|show|cancel|
requeue``, ``cluster status`` and ``stats``. Readable tables by default, ``--json`` for scripts;
errors go to stderr with exit code 1."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import httpx

from dispatcher.cli import progress

Row = dict[str, Any]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("DISPATCHER_URL"),
        help="the dispatcher's API (default: $DISPATCHER_URL, else DISPATCHER_HTTP_HOST:_PORT)",
    )
    common.add_argument(
        "--api-key",
        default=os.environ.get("DISPATCHER_API_KEY"),
        help="an API key (default: $DISPATCHER_API_KEY)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")

    jobs = commands.add_parser("jobs", help="jobs, through the HTTP API").add_subparsers(
        dest="jobs_command", required=True
    )
    listing = jobs.add_parser("list", parents=[common], help="jobs in creation order")
    listing.add_argument("--state", default=None)
    listing.add_argument("--routing-key", default=None)
    listing.add_argument("--idempotency-key", default=None)
    listing.add_argument("--limit", type=int, default=50, help="at most this many (all pages)")
    show = jobs.add_parser("show", parents=[common], help="one job with its whole history")
    show.add_argument("id")
    for name, text in (("cancel", "cancel scheduled jobs"), ("requeue", "requeue dead jobs")):
        action = jobs.add_parser(name, parents=[common], help=text)
        action.add_argument("ids", nargs="+", metavar="id")
    cluster = commands.add_parser("cluster", help="the cluster, through the HTTP API")
    cluster.add_subparsers(dest="cluster_command", required=True).add_parser(
        "status", parents=[common], help="nodes, the leader, the shards each owns"
    )
    commands.add_parser("stats", parents=[common], help="jobs per state and routing key")


def run(args: argparse.Namespace, default_url: str) -> int:
    # Writes are JSON, the body-less ones too (the node refuses what a browser form could send).
    headers = {"content-type": "application/json"}
    if args.api_key:
        headers["authorization"] = f"Bearer {args.api_key}"
    try:
        with httpx.Client(base_url=args.url or default_url, headers=headers, timeout=30) as http:
            if args.command == "jobs":
                return _jobs(http, args)
            if args.command == "cluster":
                return _print(args, _get(http, "/v1/cluster"), _cluster_table)
            return _print(args, _get(http, "/v1/stats"), _stats_table)
    except _Refused as exc:
        print(f"dispatcher {args.command}: {exc}", file=sys.stderr)
    except httpx.HTTPError as exc:
        print(f"dispatcher {args.command}: {exc!r}", file=sys.stderr)
    return 1


class _Refused(Exception):
    pass


def _check(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json().get("message", response.text)
        except ValueError:
            message = response.text
        raise _Refused(f"{response.status_code}: {message}")
    return response.json()


def _get(http: httpx.Client, path: str, **params: Any) -> Any:
    return _check(http.get(path, params={k: v for k, v in params.items() if v is not None}))


def _jobs(http: httpx.Client, args: argparse.Namespace) -> int:
    if args.jobs_command == "list":
        found: list[Row] = []
        after = None
        while len(found) < args.limit:
            page = _get(
                http,
                "/v1/jobs",
                state=args.state,
                routing_key=args.routing_key,
                idempotency_key=args.idempotency_key,
                limit=min(args.limit - len(found), 1000),
                after=after,
            )
            found.extend(page["jobs"])
            after = page["next_after"]
            if after is None:
                break
        return _print(args, found, _jobs_table)
    if args.jobs_command == "show":
        return _print(args, _get(http, f"/v1/jobs/{args.id}"), _job_table)
    method = "DELETE" if args.jobs_command == "cancel" else "POST"
    suffix = "" if args.jobs_command == "cancel" else "/requeue"
    done: list[Row] = []
    failed = 0
    for index, job_id in enumerate(args.ids, 1):
        try:
            done.append(_check(http.request(method, f"/v1/jobs/{job_id}{suffix}")))
        except _Refused as exc:
            failed += 1
            print(f"\n{job_id}: {exc}", file=sys.stderr)
        if len(args.ids) > 1:
            progress.draw(index, len(args.ids))
    if len(args.ids) > 1:
        sys.stderr.write("\n")
    _print(args, done, _jobs_table)
    return 1 if failed else 0


def _print(args: argparse.Namespace, data: Any, table: Any) -> int:
    if args.json:
        print(json.dumps(data, indent=None))
    else:
        print(table(data))
    return 0


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Columns padded to their widest cell."""
    cells = [[str(h) for h in header], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _jobs_table(jobs: list[Row]) -> str:
    return table(
        [(j["id"], j["state"], j["routing_key"], j["run_at"], j.get("last_error")) for j in jobs],
        ["id", "state", "routing key", "run at", "error"],
    )


def _job_table(job: Row) -> str:
    fields = ["id", "state", "routing_key", "run_at", "dispatched_at", "idempotency_key"]
    head = table([(name, job.get(name)) for name in fields], ["field", "value"])
    steps = [
        (s["at"], s["event"], s.get("attempt"), s.get("consumer"), s.get("error"))
        for s in job.get("history", [])
    ]
    return head + "\n\n" + table(steps, ["at", "event", "attempt", "consumer", "error"])


def _cluster_table(cluster: Row) -> str:
    # Shards are a list (single-node) or a {shard: epoch} map (ZooKeeper): either iterates them.
    assignment = {n: [int(s) for s in shards] for n, shards in cluster["assignment"].items()}
    nodes = sorted(set(cluster.get("members", [])) | set(assignment))
    rows = [
        (
            node,
            "leader" if node == cluster.get("leader") else "",
            len(assignment.get(node, [])),
            _ranges(assignment.get(node, [])),
        )
        for node in nodes
    ]
    return f"mode: {cluster.get('mode')}\n" + table(rows, ["node", "role", "shards", "owns"])


def _ranges(shards: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts: list[str] = []
    for shard in sorted(shards):
        if parts and parts[-1].split("-")[-1] == str(shard - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{shard}"
        else:
            parts.append(str(shard))
    return ",".join(parts)


def _stats_table(stats: Row) -> str:
    by_state = table(sorted(stats["by_state"].items()), ["state", "jobs"])
    named = sorted((c["routing_key"], c["state"], c["jobs"]) for c in stats["counts"])
    other = [
        ("(other keys)", state, jobs)
        for state, jobs in sorted(stats.get("other", {}).items())
        if jobs
    ]
    counts = table(named + other, ["routing key", "state", "jobs"])
    return f"counted at {stats['counted_at']}\n\n{by_state}\n\n{counts}"
