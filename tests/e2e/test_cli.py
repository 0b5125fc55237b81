"""The operator's CLI against a real dispatcher process with API keys: jobs, cluster status,
stats; and one dead job sent back to its routing key with its history in its headers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from consumers_sdk import Consumer, Job, topology
from devstack.dispatcher_process import DispatcherProcess
from devstack.jobs_out import job, publish
from devstack.rabbitmq import RabbitServer
from dispatcher.cli import http as cli_http
from dispatcher.cli import main as dispatcher_main
from tests.support.process import served
from tests.support.queues import depth_reaches
from tests.support.waiting import eventually, until

pytestmark = pytest.mark.e2e
ADMIN = "admin-token-0123456789abcdef"


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    yield from served(
        tmp_path,
        database_url,
        amqp_url,
        env={"DISPATCHER_API_KEYS": f"{ADMIN}:admin", "DISPATCHER_STATS_INTERVAL_S": "0.2"},
        api_key=ADMIN,
    )


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "dispatcher", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )


async def test_jobs_cluster_and_stats_commands_with_an_api_key(
    dispatcher: DispatcherProcess,
) -> None:
    env = {"DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ADMIN}
    later = {"routing_key": "orders.expire", "payload": 1, "delay_ms": 3_600_000}
    async with httpx.AsyncClient(
        base_url=dispatcher.url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        ids = [(await http.post("/v1/jobs", json=later)).json()["id"] for _ in range(3)]

    listed = await cli(env, "jobs", "list", "--json")
    assert [j["id"] for j in json.loads(listed.stdout)] == ids
    table = (await cli(env, "jobs", "list", "--routing-key", "orders.expire")).stdout
    assert table.splitlines()[0].split() == ["id", "state", "routing", "key", "run", "at", "error"]
    assert len(table.splitlines()) == 4
    shown = (await cli(env, "jobs", "show", ids[0])).stdout
    assert "scheduled" in shown
    assert ids[0] in shown
    keyed = {**later, "idempotency_key": "remind-1", "on_existing": "extend"}
    async with httpx.AsyncClient(
        base_url=dispatcher.url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        reminder = (await http.post("/v1/jobs", json=keyed)).json()["id"]
        await http.post("/v1/jobs", json={**keyed, "delay_ms": 7_200_000})
    shown = (await cli(env, "jobs", "show", reminder)).stdout
    assert "extended" in shown, shown
    assert "run_at 20" in shown, shown  # the new time, in the step's detail
    cancelled = await cli(env, "jobs", "cancel", ids[0], ids[1])
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stderr == ""  # no progress bar off a terminal
    status = (await cli(env, "cluster", "status")).stdout
    assert "node  leader  256     0-255" in status

    async def counted() -> bool:  # by a stats round after the cancel (every 0.2 s)
        stats = json.loads((await cli(env, "stats", "--json")).stdout)
        return (stats["by_state"].get("cancelled"), stats["by_state"].get("scheduled")) == (2, 2)

    await until(counted, 15)
    assert "orders.expire" in (await cli(env, "stats")).stdout
    refused = await cli({"DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ""}, "stats")
    assert refused.returncode == 1
    assert "401" in refused.stderr


async def test_jobs_list_by_routing_key_prefix_lists_those_words_and_below(
    dispatcher: DispatcherProcess,
) -> None:
    env = {"DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ADMIN}
    keys = ["billing.charge", "billingx.charge", "orders.expire", "billing.refund.late"]
    async with httpx.AsyncClient(
        base_url=dispatcher.url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        for key in keys:
            later = {"routing_key": key, "payload": 1, "delay_ms": 3_600_000}
            assert (await http.post("/v1/jobs", json=later)).status_code == 201

    listed = await cli(env, "jobs", "list", "--routing-key-prefix", "billing.", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [j["routing_key"] for j in json.loads(listed.stdout)] == [
        "billing.charge",
        "billing.refund.late",
    ]
    table = (await cli(env, "jobs", "list", "--routing-key-prefix", "billing.refund")).stdout
    assert len(table.splitlines()) == 2  # the header and the one job
    both = await cli(env, "jobs", "list", "--routing-key", "a", "--routing-key-prefix", "a")
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr
    refused = await cli(env, "jobs", "list", "--routing-key-prefix", "bill%")
    assert refused.returncode == 1
    assert "routing_key_prefix" in refused.stderr


async def test_jobs_bulk_counts_first_and_changes_nothing_without_yes_off_a_terminal(
    dispatcher: DispatcherProcess,
) -> None:
    env = {"DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ADMIN}
    later = {"routing_key": "reports.weekly", "payload": 1, "delay_ms": 3_600_000}
    async with httpx.AsyncClient(
        base_url=dispatcher.url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        ids = [(await http.post("/v1/jobs", json=later)).json()["id"] for _ in range(5)]
        kept = (await http.post("/v1/jobs", json={**later, "routing_key": "reports.daily"})).json()

        refused = await cli(env, "jobs", "bulk", "cancel", "--routing-key", "reports.weekly")
        assert refused.returncode == 1
        assert "5 jobs match" in refused.stderr
        assert "pass --yes" in refused.stderr
        assert (await http.get("/v1/bulk-actions")).json()["bulk_actions"] == []

        moved = await cli(
            env, "jobs", "bulk", "reschedule", "--routing-key-prefix", "reports.weekly",
            "--shift", "60", "--yes",
        )  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout.startswith("done: 5 jobs rescheduled (bulk action ")
        for job_id in ids:
            history = (await http.get(f"/v1/jobs/{job_id}")).json()["history"]
            assert [step["event"] for step in history] == ["scheduled", "rescheduled"]
        assert (await http.get(f"/v1/jobs/{kept['id']}")).json()["run_at"] == kept["run_at"]
    listed = json.loads((await cli(env, "jobs", "bulk", "list", "--json")).stdout)
    assert [(a["action"], a["status"], a["touched"]) for a in listed] == [("reschedule", "done", 5)]


@pytest.mark.rabbitmq_version
async def test_dlq_requeue_of_one_job_sends_it_to_its_routing_key_with_its_history(
    amqp_url: str,
) -> None:
    broken = True
    handled: list[tuple[str, int, object]] = []
    consumer = Consumer(amqp_url, group="billing", retry_tiers=(0.3,), report_events=False)

    @consumer.handler("orders.expire", max_attempts=2, backoff=lambda _: 0.3)
    async def expire(job: Job) -> None:
        if broken:
            raise RuntimeError("downstream is down")
        handled.append((job.id, job.attempt, (job.message.headers or {}).get("x-dead-attempts")))

    dead = topology.dead_queue("billing.orders.expire")
    task = asyncio.create_task(consumer.run(handle_signals=False))
    await asyncio.wait_for(consumer.ready.wait(), 30)
    try:
        ids = await publish(amqp_url, [job("orders.expire", i) for i in range(3)])
        await depth_reaches(amqp_url, dead, 3, 20)
        broken = False
        moved = await cli(
            {"DISPATCHER_AMQP_URL": amqp_url}, "dlq", "requeue", dead, "--job", ids[1]
        )
        assert moved.returncode == 0, moved.stderr
        assert f"requeued job {ids[1]}" in moved.stdout
        assert "routing key orders.expire" in moved.stdout
        await eventually(lambda: len(handled) == 1, 20)
        missing = await cli({"DISPATCHER_AMQP_URL": amqp_url}, "dlq", "requeue", dead, "--job", "x")
        assert missing.returncode == 1
        assert "no job x" in missing.stderr
    finally:
        consumer.stop()
        await task
    assert handled == [(ids[1], 1, 2)]  # a fresh attempt; its history rode along
    await depth_reaches(amqp_url, dead, 2, 10)  # the others stayed, each looked at once


@pytest.mark.rabbitmq_version
async def test_broker_apply_policies_and_dlq_list_as_a_user_runs_them(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    env = {
        "DISPATCHER_AMQP_URL": amqp_url,
        "DISPATCHER_AMQP_MANAGEMENT_URL": rabbit_server.mgmt_url.replace(
            "http://", "http://guest:guest@"
        ),
    }
    dry = await cli(env, "broker", "apply-policies", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would apply policy dispatcher-events" in dry.stdout
    applied = await cli(env, "broker", "apply-policies", "--priority", "5")
    assert applied.returncode == 0, applied.stderr
    assert "applied policy dispatcher-events" in applied.stdout
    assert ("dispatcher-dead-letter-queues" in applied.stdout) == (rabbit_server.major >= 4)
    listed = await cli(env, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    # apply-policies declared the events' dead-letter queue; it is listed, empty and counted.
    assert {
        "name": topology.EVENTS_DEAD_QUEUE,
        "messages": 0,
        "work_queue": "dispatcher.events",
    } in (json.loads(listed.stdout))
    unreachable = await cli(
        {**env, "DISPATCHER_AMQP_MANAGEMENT_URL": "http://127.0.0.1:9/"}, "broker", "apply-policies"
    )
    assert unreachable.returncode == 1
    assert "management API" in unreachable.stderr


async def create_schedules(url: str, *names: str) -> None:
    async with httpx.AsyncClient(
        base_url=url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        for name in names:
            created = await http.post(
                "/v1/schedules",
                json={
                    "name": name,
                    "cron": "0 3 * * *",
                    "timezone": "Europe/Paris",
                    "job": {"routing_key": f"reports.{name}", "payload": {"report": name}},
                },
            )
            assert created.status_code == 201, created.text


async def test_schedules_list_show_pause_resume_delete(dispatcher: DispatcherProcess) -> None:
    env = {"DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ADMIN}
    await create_schedules(dispatcher.url, "nightly", "weekly")

    listed = await cli(env, "schedules", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["name", "state", "timing"]
    assert lines[1].split()[:5] == ["nightly", "active", "0", "3", "*"]
    assert "(Europe/Paris)  reports.nightly" in lines[1]
    assert lines[2].startswith("weekly ")
    as_json = json.loads((await cli(env, "schedules", "list", "--json")).stdout)
    assert [s["name"] for s in as_json] == ["nightly", "weekly"]
    assert as_json[0]["job"]["payload"] == {"report": "nightly"}

    shown = await cli(env, "schedules", "show", "nightly")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("upcoming") == 5  # the next occurrences, one a line
    assert "state          active" in shown.stdout

    paused = await cli(env, "schedules", "pause", "nightly")
    assert (paused.returncode, paused.stdout) == (0, "paused schedule nightly\n")
    shown = await cli(env, "schedules", "show", "nightly", "--json")
    assert json.loads(shown.stdout)["paused"] is True
    assert "paused" in (await cli(env, "schedules", "list")).stdout.splitlines()[1]

    resumed = await cli(env, "schedules", "resume", "nightly", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["paused"] is False
    assert json.loads(resumed.stdout)["next_at"] is not None

    deleted = await cli(env, "schedules", "delete", "weekly")
    assert (deleted.returncode, deleted.stdout) == (0, "deleted schedule weekly\n")
    left = json.loads((await cli(env, "schedules", "list", "--json")).stdout)
    assert [s["name"] for s in left] == ["nightly"]

    for action in ("show", "pause", "resume", "delete"):
        missing = await cli(env, "schedules", action, "weekly")
        assert (missing.returncode, missing.stdout) == (1, ""), action
        assert missing.stderr == "dispatcher schedules: no schedule weekly\n"
    refused = await cli({**env, "DISPATCHER_API_KEY": "wrong"}, "schedules", "list")
    assert refused.returncode == 1
    assert "401" in refused.stderr


async def test_limits_pause_list_show_resume_delete(dispatcher: DispatcherProcess) -> None:
    env = {"DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ADMIN}
    paused = await cli(env, "limits", "pause", "billing.", "--note", "card processor down")
    assert (paused.returncode, paused.stdout) == (0, "paused billing in every namespace\n")
    until = await cli(
        env, "limits", "pause", "mail", "--namespace", "", "--until", "2099-01-01T00:00:00Z"
    )
    assert until.returncode == 0, until.stderr
    assert until.stdout == ("paused mail in the default namespace until 2099-01-01T00:00:00Z\n")
    listed = await cli(env, "limits", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["key", "namespace", "now"]
    assert lines[1].split()[:3] == ["billing", "*", "held"]
    assert lines[2].split()[:3] == ["mail", "(default)", "held"]
    # Who set each rule last: an admin key's rules are the operator's.
    assert [line.split()[-1] for line in lines] == ["owner", "operator", "operator"]
    as_json = json.loads((await cli(env, "limits", "list", "--json")).stdout)
    assert [(r["key"], r["note"]) for r in as_json] == [
        ("billing", "card processor down"),
        ("mail", None),
    ]
    shown = await cli(env, "limits", "show", "mail", "--namespace", "", "--json")
    assert json.loads(shown.stdout)["paused_until"] == "2099-01-01T00:00:00Z"

    resumed = await cli(env, "limits", "resume", "billing")
    assert (resumed.returncode, resumed.stdout) == (0, "resumed billing in every namespace\n")
    deleted = await cli(env, "limits", "delete", "mail", "--namespace", "")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads((await cli(env, "limits", "list", "--json")).stdout) == []
    for action in ("show", "resume", "delete"):
        missing = await cli(env, "limits", action, "billing")
        assert (missing.returncode, missing.stdout) == (1, ""), action
        assert missing.stderr == "dispatcher limits: no rule for billing\n"
    refused = await cli(env, "limits", "pause", "bill..ing")
    assert refused.returncode == 1
    assert "422" in refused.stderr

    metered = await cli(env, "limits", "set", "billing", "--rate", "200")
    assert (metered.returncode, metered.stdout) == (
        0,
        "set billing in every namespace: 200/s burst 20\n",
    )
    shown = await cli(env, "limits", "show", "billing", "--json")
    rule = json.loads(shown.stdout)
    assert (rule["rate_per_s"], rule["burst"], rule["metering"]) == (200, 20, True)
    assert (rule["max_in_flight"], rule["in_flight_timeout_s"]) == (None, None)
    both = await cli(
        env, "limits", "set", "mail", "--namespace", "", "--paused", "--max-in-flight", "50"
    )
    assert both.stdout == "set mail in the default namespace: paused, in flight 50 timeout 300s\n"
    listed = await cli(env, "limits", "list")
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:5] == ["key", "namespace", "now", "rate", "in"]
    assert lines[1].split()[:5] == ["billing", "*", "metered", "200/s", "burst"]
    assert lines[2].split()[:6] == ["mail", "(default)", "held", "50", "timeout", "300s"]
    unmetered = await cli(env, "limits", "set", "billing", "--burst", "5")
    assert unmetered.returncode == 1
    assert "422" in unmetered.stderr
    assert "burst" in unmetered.stderr


async def test_schedules_list_follows_the_pages(
    dispatcher: DispatcherProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    names = [f"report-{i}" for i in range(5)]
    await create_schedules(dispatcher.url, *names)
    monkeypatch.setattr(cli_http, "PAGE", 2)  # three pages for five schedules
    monkeypatch.delenv("DISPATCHER_API_KEY", raising=False)
    key_file = tmp_path / "admin.key"
    key_file.write_text(f"{ADMIN}\n")  # the key from a file: never on the command line
    argv = ["schedules", "list", "--json", "--url", dispatcher.url, "--api-key-file", str(key_file)]
    assert await asyncio.to_thread(dispatcher_main, argv) == 0
    assert [s["name"] for s in json.loads(capsys.readouterr().out)] == names
    assert await asyncio.to_thread(dispatcher_main, [*argv, "--limit", "3"]) == 0
    assert [s["name"] for s in json.loads(capsys.readouterr().out)] == names[:3]


async def test_keys_list_is_a_table(database_url: str) -> None:
    env = {"DISPATCHER_DATABASE_URL": database_url}
    created = await cli(
        env,
        "keys",
        "create",
        "--scope",
        "producer",
        "--namespace",
        "billing",
        "--routing-key-prefix",
        "billing.",
        "--routing-key-prefix",
        "audit.",
        "--name",
        "ci",
    )
    assert created.returncode == 0, created.stderr
    await cli(env, "keys", "create", "--scope", "monitor", "--name", "prometheus")
    revoked = await cli(env, "keys", "revoke", "2")
    assert revoked.returncode == 0, revoked.stderr
    listed = await cli(env, "keys", "list")
    assert listed.returncode == 0, listed.stderr
    header, first, second = listed.stdout.splitlines()
    assert header.split() == ["id", "scope", "namespace", "prefixes", "name", "created", "revoked"]
    assert first.split()[:5] == ["1", "producer", "billing", "billing.,audit.", "ci"]
    assert len(first.split()) == 6  # not revoked: the last cell is empty
    assert second.split()[:4] == ["2", "monitor", "*", "prometheus"]
    assert len(second.split()) == 6  # its revocation time; no namespace
    assert json.loads((await cli(env, "keys", "list", "--json")).stdout)[0]["name"] == "ci"
