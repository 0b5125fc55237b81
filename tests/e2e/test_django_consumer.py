"""``manage.py run_consumer`` (the SDK's Django app) as an operator runs it: a consumer module of
the project, handled inside a configured Django with the runner's flags, and SIGTERM letting the
running job finish before a clean exit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from consumers_sdk import topology
from tests.support.consumer_process import read, sigterm_while_handling
from tests.support.queues import queue_depth

pytestmark = pytest.mark.e2e

SETTINGS = """
SECRET_KEY = "test"
INSTALLED_APPS = ["consumers_sdk.integrations.django"]
DATABASES = {}
USE_TZ = True
GREETING = "configured"
"""

CONSUMERS = """
import os
import pathlib
import time

from django.conf import settings

from consumers_sdk import Consumer, Job

NOTES = pathlib.Path(os.environ["RUNNER_NOTES"])
consumer = Consumer(os.environ["RUNNER_AMQP_URL"], group="django", report_events=False)


def note(line: str) -> None:
    with NOTES.open("a") as notes:
        notes.write(line + "\\n")


@consumer.handler("django.work", timeout=60)
def work(job: Job) -> None:  # sync, as Django code is: run in a thread
    note(f"start {job.id} {settings.GREETING}")
    time.sleep(job.payload["sleep_s"])
    note(f"end {job.id}")
"""


def manage(tmp_path: Path, *arguments: str) -> list[str]:
    """``django-admin`` (what manage.py runs) with the project in tmp_path."""
    (tmp_path / "project_settings.py").write_text(SETTINGS)
    (tmp_path / "project_consumers.py").write_text(CONSUMERS)
    return [sys.executable, "-m", "django", *arguments, "--settings", "project_settings"]


def environment(tmp_path: Path, amqp_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return {
        **env,
        "PYTHONPATH": str(tmp_path),  # the project's folder, as manage.py puts it first
        "RUNNER_NOTES": str(tmp_path / "notes.txt"),
        "RUNNER_AMQP_URL": amqp_url,
    }


async def test_run_consumer_handles_jobs_in_django_and_finishes_the_running_one_on_sigterm(
    tmp_path: Path, amqp_url: str
) -> None:
    notes, log = tmp_path / "notes.txt", tmp_path / "command.log"
    queue = topology.work_queue("django", "django.work")
    code, job_id = await sigterm_while_handling(
        manage(tmp_path, "run_consumer", "project_consumers:consumer", "--prefetch", "2"),
        cwd=tmp_path,
        env=environment(tmp_path, amqp_url),
        amqp_url=amqp_url,
        queue=queue,
        routing_key="django.work",
        notes=notes,
        log=log,
    )
    assert code == 0, read(log)
    assert "group django, prefetch 2" in read(log)
    assert read(notes).splitlines() == [f"start {job_id} configured", f"end {job_id}"]
    assert await queue_depth(amqp_url, queue) == 0  # acked once done, not handed back
    assert "Traceback" not in read(log)


async def test_run_consumer_with_a_bad_target_says_so_and_exits_2(
    tmp_path: Path, amqp_url: str
) -> None:
    ran = await asyncio.to_thread(
        subprocess.run,
        manage(tmp_path, "run_consumer", "project_consumers:nothing"),
        cwd=tmp_path,
        env=environment(tmp_path, amqp_url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 2
    assert ran.stderr.strip() == (
        "CommandError: module 'project_consumers' has no attribute 'nothing'"
    )
