"""JSON logs on both sides: a real node with ``DISPATCHER_LOG_FORMAT=json`` and the consumer
runner with ``--log-format json`` write nothing but JSON objects, one a line."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.dispatcher_process import DispatcherProcess
from tests.support.process import served, spawn
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e
ADMIN = "admin-token-0123456789abcdef"
FIELDS = {"ts", "level", "logger", "message"}
APP = """
import os

from consumers_sdk import Consumer, Job

consumer = Consumer(os.environ["RUNNER_AMQP_URL"], group="jsonlogs", report_events=False)


@consumer.handler("jsonlogs.work")
async def work(job: Job) -> None:
    pass
"""


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    """A JSON-logging node with a key, so that a request without one is refused (and logged)."""
    env = {"DISPATCHER_API_KEYS": f"{ADMIN}:admin", "DISPATCHER_LOG_FORMAT": "json"}
    yield from served(tmp_path, database_url, amqp_url, env=env, api_key=ADMIN)


def objects(text: str) -> list[dict[str, Any]]:
    """Each line of ``text`` as a JSON object; fails on a line that is not one."""
    parsed = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(isinstance(item, dict) and item.keys() >= FIELDS for item in parsed), parsed
    return parsed


async def test_a_json_node_logs_one_object_a_line_even_for_a_forged_path(
    dispatcher: DispatcherProcess,
) -> None:
    async with httpx.AsyncClient(base_url=dispatcher.url, timeout=10) as http:
        refused = await http.get("/v1/jobs/marker%0A2030-01-01%20INFO%20forged")
    assert refused.status_code == 401

    await eventually(lambda: "marker" in dispatcher.logs(tail=100_000), 30)
    lines = objects(dispatcher.logs(tail=100_000))
    [marked] = [line for line in lines if "marker" in line["message"]]
    assert "refused GET /v1/jobs/marker\n2030-01-01 INFO forged" in marked["message"]
    assert marked["action"] == "auth"  # the structured fields are there


async def test_the_runner_logs_json_lines_with_its_flag(tmp_path: Path, amqp_url: str) -> None:
    (tmp_path / "runner_json_app.py").write_text(APP)
    log = tmp_path / "runner.log"
    process = spawn(
        [
            "-m",
            "consumers_sdk",
            "runner_json_app:consumer",
            "--app-dir",
            str(tmp_path),
            "--log-format",
            "json",
        ],
        {"RUNNER_AMQP_URL": amqp_url},
        log,
    )
    try:
        await eventually(lambda: "running runner_json_app:consumer" in log.read_text(), 30)
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0, log.read_text()
    [running] = [line for line in objects(log.read_text()) if line["message"].startswith("running")]
    assert running["logger"] == "__main__"  # the runner's module, run with -m
    assert running["level"] == "INFO"
