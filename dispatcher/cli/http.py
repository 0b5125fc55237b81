"""The commands that talk to a dispatcher's HTTP API with an API key: ``jobs list|show|cancel|
requeue|bulk`` (``cli.bulk``), ``schedules list|show|pause|resume|delete``, ``limits list|show|
set|pause|resume|delete``, ``cluster status`` and ``stats``.
Tables that fit the terminal by default, ``--json`` with everything for scripts; errors go to
stderr with exit code 1."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from dispatcher.cli import bulk, credentials, parsers, patient, progress, tables

Row = dict[str, Any]
PAGE = 1000  # rows asked for at a time (the API's most)


def add_parsers(commands: parsers.Commands) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("DISPATCHER_URL"),
        help="the dispatcher's API (default: $DISPATCHER_URL, else DISPATCHER_HTTP_HOST:_PORT)",
    )
    credentials.add_options(common, "an API key")
    common.add_argument("--json", action="store_true", help="machine-readable output, nothing cut")

    jobs = parsers.group(commands, "jobs", "jobs, through the HTTP API")
    listing = parsers.command(
        jobs,
        "list",
        "jobs in creation order, as a table that fits the terminal",
        example="dispatcher jobs list --state dead --routing-key-prefix billing. --limit 20",
        parents=[common],
    )
    listing.add_argument("--state", default=None, help="only jobs in this state, e.g. dead")
    keys = listing.add_mutually_exclusive_group()
    keys.add_argument("--routing-key", default=None, help="only jobs with this routing key")
    keys.add_argument(
        "--routing-key-prefix",
        default=None,
        help="only jobs of these words or below (billing.: billing.charge, billing)",
    )
    listing.add_argument(
        "--idempotency-key", default=None, help="only the job with this idempotency key"
    )
    listing.add_argument("--limit", type=int, default=50, help="at most this many (all pages)")
    show = parsers.command(jobs, "show", "one job with its whole history", parents=[common])
    show.add_argument("id", help="the job's id")
    for name, text in (("cancel", "cancel scheduled jobs"), ("requeue", "requeue dead jobs")):
        action = parsers.command(
            jobs, name, text, example=f"dispatcher jobs {name} ID...", parents=[common]
        )
        action.add_argument("ids", nargs="+", metavar="id", help="a job's id (several: a bar)")
    bulk.add_parsers(jobs, common)
    _schedules_parsers(commands, common)
    _limits_parsers(commands, common)
    parsers.command(
        parsers.group(commands, "cluster", "the cluster, through the HTTP API"),
        "status",
        "nodes, the leader, the shards each owns",
        parents=[common],
    )
    parsers.command(commands, "stats", "jobs per state and routing key", parents=[common])


def _schedules_parsers(commands: parsers.Commands, common: argparse.ArgumentParser) -> None:
    schedules = parsers.group(commands, "schedules", "recurring schedules, through the HTTP API")
    listing = parsers.command(
        schedules,
        "list",
        "every schedule the key may see, in creation order",
        example="dispatcher schedules list --json | jq '.[].name'",
        parents=[common],
    )
    listing.add_argument("--limit", type=int, default=None, help="at most this many (all pages)")
    for name, text in (
        ("show", "one schedule with its next occurrences"),
        ("pause", "pause a schedule: no new occurrences until it is resumed"),
        ("resume", "resume a paused schedule from now on (missed occurrences are not made up)"),
        ("delete", "delete a schedule; the jobs it already made stay"),
    ):
        action = parsers.command(
            schedules,
            name,
            text,
            example=f"dispatcher schedules {name} nightly-report",
            parents=[common],
        )
        action.add_argument("name", help="the schedule's name")


def _limits_parsers(commands: parsers.Commands, common: argparse.ArgumentParser) -> None:
    limits = parsers.group(
        commands, "limits", "flow rules: hold a routing key's jobs back, through the HTTP API"
    )
    scoped = argparse.ArgumentParser(add_help=False)
    scoped.add_argument(
        "--namespace",
        default=None,
        help="the rule's namespace ('' the default one); none: an admin's rule for every"
        " namespace, another key's own namespace",
    )
    parsers.command(
        limits,
        "list",
        "every rule the key may see",
        example="dispatcher limits list --json | jq '.[] | select(.holding)'",
        parents=[common, scoped],
    )
    _limits_set_parser(limits, [common, scoped])
    pause = parsers.command(
        limits,
        "pause",
        "hold the key's jobs (and its prefix's): scheduled, never published, until resumed",
        example="dispatcher limits pause billing --note 'card processor down' \\\n"
        "    --until 2026-12-01T08:00:00Z",
        parents=[common, scoped],
    )
    pause.add_argument("key", help="a routing key, or a prefix of its words (billing)")
    pause.add_argument("--until", default=None, help="end the pause by itself then (RFC 3339)")
    pause.add_argument("--note", default=None, help="why, for the next operator")
    for name, text in (
        ("show", "one rule"),
        ("resume", "let the key's held jobs go, oldest due first (a metered rule stays metered)"),
        ("delete", "delete the rule: its jobs go as if it never was"),
    ):
        action = parsers.command(
            limits,
            name,
            text,
            example=f"dispatcher limits {name} billing",
            parents=[common, scoped],
        )
        action.add_argument("key", help="the rule's key")


def _limits_set_parser(limits: parsers.Commands, parents: list[argparse.ArgumentParser]) -> None:
    put = parsers.command(
        limits,
        "set",
        "set a key's rule whole (what is not given is not kept): a pause, a rate, a number in"
        " flight, or several",
        example="dispatcher limits set billing --rate 200 --max-in-flight 50 \\\n"
        "    --note 'card processor: 200 calls a second'",
        parents=parents,
    )
    put.add_argument("key", help="a routing key, or a prefix of its words (billing)")
    for option, metavar, kind, text in (
        ("--rate", "R", float, "at most this many jobs let go a second"),
        ("--burst", "B", int, "with --rate: at most this many at once (default: a tenth)"),
        ("--max-in-flight", "N", int, "at most this many let go and not yet finished"),
        ("--in-flight-timeout", "SECONDS", float, "a silent job's slot is freed after (300)"),
    ):
        put.add_argument(option, type=kind, default=None, metavar=metavar, help=text)
    put.add_argument("--paused", action="store_true", help="hold the key's jobs until resumed")
    put.add_argument("--until", metavar="ISO", help="with --paused: end the pause then (RFC 3339)")
    put.add_argument("--note", default=None, help="why, for the next operator")


def run(args: argparse.Namespace, default_url: str) -> int:
    # httpx logs every request at INFO: a line per job would bury the results and the bar.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Writes are JSON, the body-less ones too (the node refuses what a browser form could send).
    headers = {"content-type": "application/json"}
    token = credentials.token(args)
    if token:
        headers["authorization"] = f"Bearer {token}"
    try:
        with httpx.Client(
            base_url=args.url or default_url,
            headers=headers,
            timeout=30,
            transport=patient.PatientTransport(),
        ) as http:
            if args.command == "jobs":
                return _jobs(http, args)
            if args.command == "schedules":
                return _schedules(http, args)
            if args.command == "limits":
                return _limits(http, args)
            if args.command == "cluster":
                return _print(args, _get(http, "/v1/cluster"), _cluster_table)
            return _print(args, _get(http, "/v1/stats"), _stats_table)
    except _Refused as exc:
        print(f"dispatcher {args.command}: {exc}", file=sys.stderr)
    except httpx.HTTPError as exc:
        print(f"dispatcher {args.command}: {exc!r}", file=sys.stderr)
    return 1


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def _check(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json().get("message", response.text)
        except ValueError:
            message = response.text
        raise _Refused(response.status_code, message)
    return response.json()


def _get(http: httpx.Client, path: str, **params: Any) -> Any:
    return _check(http.get(path, params={k: v for k, v in params.items() if v is not None}))


def _pages(http: httpx.Client, path: str, key: str, limit: int | None, **params: Any) -> list[Row]:
    """Follows the cursor (``next_after``) until ``limit`` rows or the last page."""
    found: list[Row] = []
    after = None
    while limit is None or len(found) < limit:
        size = PAGE if limit is None else min(limit - len(found), PAGE)
        page = _get(http, path, limit=size, after=after, **params)
        found.extend(page[key])
        after = page["next_after"]
        if after is None:
            break
    return found


def _jobs(http: httpx.Client, args: argparse.Namespace) -> int:
    if args.jobs_command == "list":
        found = _pages(
            http,
            "/v1/jobs",
            "jobs",
            args.limit,
            state=args.state,
            routing_key=args.routing_key,
            routing_key_prefix=args.routing_key_prefix,
            idempotency_key=args.idempotency_key,
        )
        return _print(args, found, _jobs_table)
    if args.jobs_command == "show":
        return _print(args, _get(http, f"/v1/jobs/{quote(args.id, safe='')}"), _job_table)
    if args.jobs_command == "bulk":
        return bulk.run(http, args, _check)
    method = "DELETE" if args.jobs_command == "cancel" else "POST"
    suffix = "" if args.jobs_command == "cancel" else "/requeue"
    done: list[Row] = []
    failed = 0
    with progress.bar() as drawn:
        for index, job_id in enumerate(args.ids, 1):
            path = f"/v1/jobs/{quote(job_id, safe='')}{suffix}"
            try:
                done.append(_check(http.request(method, path)))
            except _Refused as exc:
                failed += 1
                drawn.say(f"{job_id}: {exc}")
            if len(args.ids) > 1:
                drawn(index, len(args.ids))
    _print(args, done, _jobs_table)
    return 1 if failed else 0


def _schedules(http: httpx.Client, args: argparse.Namespace) -> int:
    if args.schedules_command == "list":
        found = _pages(http, "/v1/schedules", "schedules", args.limit)
        return _print(args, found, _schedules_table)
    path = f"/v1/schedules/{quote(args.name, safe='')}"
    try:
        if args.schedules_command == "show":
            return _print(args, _get(http, path), _schedule_table)
        if args.schedules_command == "delete":
            schedule = _check(http.delete(path))
        else:
            paused = args.schedules_command == "pause"
            schedule = _check(http.patch(path, json={"paused": paused}))
    except _Refused as exc:
        if exc.status != 404:
            raise
        print(f"dispatcher schedules: no schedule {args.name}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(schedule))
    elif args.schedules_command == "resume":
        print(f"resumed schedule {args.name}; next occurrence at {schedule['next_at']}")
    else:
        done = {"pause": "paused", "delete": "deleted"}[args.schedules_command]
        print(f"{done} schedule {args.name}")
    return 0


def _limits(http: httpx.Client, args: argparse.Namespace) -> int:
    scope = {"namespace": args.namespace} if args.namespace is not None else {}
    if args.limits_command == "list":
        found = _get(http, "/v1/limits", **scope)["limits"]
        return _print(args, found, _limits_table)
    path = f"/v1/limits/{quote(args.key, safe='')}"
    try:
        if args.limits_command == "show":
            return _print(args, _check(http.get(path, params=scope)), _limit_table)
        if args.limits_command == "set":
            rule = _check(http.put(path, params=scope, json=_limits_body(args)))
        elif args.limits_command == "pause":
            body = {"until": args.until, "note": args.note}
            rule = _check(http.post(f"{path}/pause", params=scope, json=body))
        elif args.limits_command == "resume":
            rule = _check(http.post(f"{path}/resume", params=scope))
        else:
            rule = _check(http.delete(path, params=scope))
    except _Refused as exc:
        if exc.status != 404:
            raise
        print(f"dispatcher limits: no rule for {args.key}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rule))
    elif args.limits_command == "set":
        print(f"set {rule['key']} in {_where(rule)}: {_limits_text(rule)}")
    else:
        done = {"pause": "paused", "resume": "resumed", "delete": "deleted the rule of"}
        until = f" until {rule['paused_until']}" if rule.get("paused_until") else ""
        print(f"{done[args.limits_command]} {rule['key']} in {_where(rule)}{until}")
    return 0


def _limits_body(args: argparse.Namespace) -> Row:
    """The PUT body: what the command line gave (the API fills the defaults)."""
    given = {
        "paused_until": args.until,
        "note": args.note,
        "rate_per_s": args.rate,
        "burst": args.burst,
        "max_in_flight": args.max_in_flight,
        "in_flight_timeout_s": args.in_flight_timeout,
    }
    return {"paused": args.paused} | {name: v for name, v in given.items() if v is not None}


def _rate(rule: Row) -> str | None:
    if rule.get("rate_per_s") is None:
        return None
    return f"{rule['rate_per_s']:g}/s burst {rule['burst']}"


def _in_flight(rule: Row) -> str | None:
    if rule.get("max_in_flight") is None:
        return None
    return f"{rule['max_in_flight']} timeout {rule['in_flight_timeout_s']:g}s"


def _limits_text(rule: Row) -> str:
    """What the rule holds back, in a line: "paused, 200/s burst 20, in flight 50 timeout 300s"."""
    paused = None
    if rule.get("paused"):
        paused = f"paused until {rule['paused_until']}" if rule.get("paused_until") else "paused"
    in_flight = _in_flight(rule)
    parts = [paused, _rate(rule), in_flight and f"in flight {in_flight}"]
    return ", ".join(part for part in parts if part)


def _where(rule: Row) -> str:
    namespace = rule.get("namespace")
    if namespace is None:
        return "every namespace"
    return "the default namespace" if namespace == "" else f"namespace {namespace}"


def _limits_table(rules: list[Row]) -> str:
    rows = [
        (
            r["key"],
            "*" if r["namespace"] is None else r["namespace"] or "(default)",
            _now(r),
            _rate(r),
            _in_flight(r),
            r.get("paused_until"),
            r.get("note"),
            r.get("owner"),
        )
        for r in rules
    ]
    header = ["key", "namespace", "now", "rate", "in flight", "paused until", "note", "owner"]
    return tables.table(rows, header)


def _now(rule: Row) -> str:
    if rule["holding"]:
        return "held"
    return "metered" if rule.get("metering") else "-"


def _limit_table(rule: Row) -> str:
    return tables.table([(name, rule.get(name)) for name in rule], ["field", "value"])


def _print(args: argparse.Namespace, data: Any, render: Callable[[Any], str]) -> int:
    if args.json:
        print(json.dumps(data, indent=None))
    else:
        print(render(data))
    return 0


def _jobs_table(jobs: list[Row]) -> str:
    return tables.table(
        [(j["id"], j["state"], j["routing_key"], j["run_at"], j.get("last_error")) for j in jobs],
        ["id", "state", "routing key", "run at", "error"],
    )


def _job_table(job: Row) -> str:
    fields = ["id", "state", "routing_key", "run_at", "dispatched_at", "idempotency_key"]
    fields += ["release_key", "key_released"]
    head = tables.table([(name, job.get(name)) for name in fields], ["field", "value"])
    steps = [  # a consumer's error, or what a change by the dispatcher did (the new time...)
        (
            s["at"],
            s["event"],
            s.get("attempt"),
            s.get("consumer"),
            s.get("error") or s.get("detail"),
        )
        for s in job.get("history", [])
    ]
    columns = ["at", "event", "attempt", "consumer", "error or detail"]
    return head + "\n\n" + tables.table(steps, columns)


def _state(schedule: Row) -> str:
    if schedule.get("error"):
        return "parked"  # the dispatcher paused it: it could not be planned
    if schedule["paused"]:
        return "paused"
    return "ended" if schedule["next_at"] is None else "active"


def _timing(schedule: Row) -> str:
    if schedule.get("cron"):
        return f"{schedule['cron']} ({schedule['timezone']})"
    return f"every {schedule['interval_s']}s"


def _schedules_table(schedules: list[Row]) -> str:
    rows = [
        (
            s["name"],
            _state(s),
            _timing(s),
            s["job"]["routing_key"],
            s["next_at"],
            s.get("namespace"),
        )
        for s in schedules
    ]
    return tables.table(rows, ["name", "state", "timing", "routing key", "next at", "namespace"])


def _schedule_table(schedule: Row) -> str:
    rows = [
        ("name", schedule["name"]),
        ("namespace", schedule.get("namespace")),
        ("state", _state(schedule)),
        ("timing", _timing(schedule)),
        ("routing key", schedule["job"]["routing_key"]),
        ("start at", schedule["start_at"]),
        ("end at", schedule["end_at"]),
        ("missed", f"{schedule['missed']} (grace {schedule['grace_s']}s)"),
        ("next at", schedule["next_at"]),
        ("last fired at", schedule["last_fired_at"]),
        ("error", schedule.get("error")),
        *(("upcoming", moment) for moment in schedule.get("upcoming") or []),
    ]
    return tables.table(rows, ["field", "value"])


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
    return f"mode: {cluster.get('mode')}\n" + tables.table(rows, ["node", "role", "shards", "owns"])


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
    by_state = tables.table(sorted(stats["by_state"].items()), ["state", "jobs"])
    named = sorted((c["routing_key"], c["state"], c["jobs"]) for c in stats["counts"])
    other = [
        ("(other keys)", state, jobs)
        for state, jobs in sorted(stats.get("other", {}).items())
        if jobs
    ]
    counts = tables.table(named + other, ["routing key", "state", "jobs"])
    return f"counted at {stats['counted_at']}\n\n{by_state}\n\n{counts}"
