"""What a person sees at a terminal: the commands run in a real pty of a set size against a real
dispatcher, and the assertions read the screen."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest

from devstack.dispatcher_process import DispatcherProcess
from tests.e2e import test_cli
from tests.support import terminal

pytestmark = pytest.mark.e2e
ADMIN = test_cli.ADMIN
COLUMNS = 60
BIN = Path(sys.executable).parent
LONG_KEYS = [
    f"billing.invoices.monthly-statement.regenerate-after-correction.{n}" for n in range(3)
]


dispatcher = test_cli.dispatcher  # a node that takes the admin key ADMIN


def env_for(dispatcher: DispatcherProcess) -> dict[str, str]:
    return {**os.environ, "DISPATCHER_URL": dispatcher.url, "DISPATCHER_API_KEY": ADMIN}


async def at_terminal(env: dict[str, str], *argv: str) -> terminal.Screen:
    return await asyncio.to_thread(terminal.run, argv, env=env, columns=COLUMNS)


async def schedule(dispatcher: DispatcherProcess) -> list[str]:
    async with httpx.AsyncClient(base_url=dispatcher.url, headers=dispatcher.auth) as http:
        ids = []
        for key in LONG_KEYS:
            answer = await http.post(
                "/v1/jobs", json={"routing_key": key, "payload": 1, "delay_ms": 3_600_000}
            )
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        return ids


async def test_jobs_list_fits_a_60_column_terminal_and_shows_whole_ids(
    dispatcher: DispatcherProcess,
) -> None:
    ids = await schedule(dispatcher)
    screen = await at_terminal(env_for(dispatcher), str(BIN / "dispatcher"), "jobs", "list")
    assert screen.code == 0, screen.text
    assert len(screen.lines) == 1 + len(ids)
    assert max(len(line) for line in screen.lines) <= COLUMNS, screen.text
    for job_id, line in zip(ids, screen.lines[1:], strict=True):
        assert line.startswith(f"{job_id}  "), screen.text
        assert "…" in line  # the routing key was cut, not wrapped
    # Off a terminal the same command keeps every line whole, for grep and friends.
    piped = await asyncio.create_subprocess_exec(
        str(BIN / "dispatcher"),
        "jobs",
        "list",
        env={**env_for(dispatcher), "COLUMNS": ""},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await piped.communicate()
    assert all(key in out.decode() for key in LONG_KEYS)


async def test_the_progress_bar_is_drawn_on_a_terminal_and_not_when_piped(
    dispatcher: DispatcherProcess,
) -> None:
    first, second, third = await schedule(dispatcher)
    screen = await at_terminal(
        env_for(dispatcher), str(BIN / "dispatcher"), "jobs", "cancel", first, second
    )
    assert screen.code == 0, screen.text
    assert "\r[" in screen.raw  # redrawn in place
    assert f"[{'#' * 30}] 2/2" in screen.lines  # what stays on screen: the full bar
    assert max(len(line) for line in screen.lines) <= COLUMNS, screen.text
    piped = await asyncio.create_subprocess_exec(
        str(BIN / "dispatcher"),
        "jobs",
        "cancel",
        third,
        env=env_for(dispatcher),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await piped.communicate()
    assert piped.returncode == 0
    assert third in out.decode()
    assert err == b""


async def test_help_shows_the_commands_and_fits_the_terminal() -> None:
    env = dict(os.environ)
    screen = await at_terminal(env, str(BIN / "dispatcher"), "--help")
    assert screen.code == 0, screen.text
    for name in ("serve", "migrate", "keys", "dlq", "jobs", "schedules", "cluster", "stats"):
        assert any(line.split()[:1] == [name] for line in screen.lines), (name, screen.text)
    assert max(len(line) for line in screen.lines) <= COLUMNS, screen.text
    runner = await at_terminal(env, str(BIN / "dispatcher-consumer"), "--help")
    assert runner.code == 0, runner.text
    assert runner.lines[0].startswith("usage: dispatcher-consumer")
    for flag in ("--prefetch N", "--concurrency N", "--max-per-second RATE", "--log-level LEVEL"):
        assert flag in runner.text
    assert max(len(line) for line in runner.lines) <= COLUMNS, runner.text
