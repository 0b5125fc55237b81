"""The installed ``dispatcher-consumer`` script as an operator runs it: a consumer module from
the current folder, the pace set by flags, and SIGTERM letting the running job finish."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from consumers_sdk import topology
from tests.support.consumer_process import read, sigterm_while_handling
from tests.support.queues import queue_depth

pytestmark = pytest.mark.e2e
SCRIPT = Path(sys.executable).parent / "dispatcher-consumer"
APP = """
import asyncio
import os
import pathlib

from consumers_sdk import Consumer, Job

NOTES = pathlib.Path(os.environ["RUNNER_NOTES"])
consumer = Consumer(os.environ["RUNNER_AMQP_URL"], group="runner", report_events=False)


def note(line: str) -> None:
    with NOTES.open("a") as notes:
        notes.write(line + "\\n")


@consumer.handler("runner.work", timeout=60)
async def work(job: Job) -> None:
    await asyncio.to_thread(note, f"start {job.id}")
    await asyncio.sleep(job.payload["sleep_s"])
    await asyncio.to_thread(note, f"end {job.id}")
"""


async def test_the_runner_takes_its_flags_and_finishes_the_running_job_on_sigterm(
    tmp_path: Path, amqp_url: str
) -> None:
    (tmp_path / "runner_app.py").write_text(APP)
    notes, log = tmp_path / "notes.txt", tmp_path / "runner.log"
    queue = topology.work_queue("runner", "runner.work")
    code, job_id = await sigterm_while_handling(
        [
            str(SCRIPT),
            "runner_app:consumer",
            "--prefetch",
            "3",
            "--concurrency",
            "2",
            "--max-per-second",
            "100",
            "--log-level",
            "info",
        ],
        cwd=tmp_path,  # found there, as with 'python -m'
        env={"RUNNER_NOTES": str(notes), "RUNNER_AMQP_URL": amqp_url, "PATH": "/usr/bin:/bin"},
        amqp_url=amqp_url,
        queue=queue,
        routing_key="runner.work",
        notes=notes,
        log=log,
    )
    assert code == 0, read(log)
    assert "group runner, prefetch 3, concurrency 2, max 100.0/s" in read(log)
    assert read(notes).splitlines() == [f"start {job_id}", f"end {job_id}"]
    assert await queue_depth(amqp_url, queue) == 0  # acked once done, not handed back
    assert "Traceback" not in read(log)
