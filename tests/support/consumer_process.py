"""A consumer runner in a process of its own, stopped by SIGTERM while a job runs: what the
runner's and Django's command's tests both drive."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from devstack.jobs_out import job, publish
from tests.support.queues import wait_for_consumer
from tests.support.waiting import eventually


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def sigterm_while_handling(
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    amqp_url: str,
    queue: str,
    routing_key: str,
    notes: Path,
    log: Path,
) -> tuple[int, str]:
    """Start ``command`` (output to ``log``), publish one job of two seconds once it consumes
    ``queue``, SIGTERM it once the handler noted ``start <id>`` in ``notes``; its exit code and
    the job's id. The process is killed if it outlives the test."""
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *command, cwd=cwd, env=dict(env), stdout=output, stderr=output
        )
    try:
        await wait_for_consumer(amqp_url, queue)
        [job_id] = await publish(amqp_url, [job(routing_key, {"sleep_s": 2})])
        await eventually(lambda: f"start {job_id}" in read(notes), 30)
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return code, job_id
