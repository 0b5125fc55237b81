"""The README's example runs as written: its consumer, started with the command the README
gives, handles the job its curl request schedules, and the job ends `succeeded`."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import signal
from pathlib import Path

import httpx
import pytest

from devstack.dispatcher_process import DispatcherProcess
from tests.support.process import spawn
from tests.support.queues import wait_for_consumer
from tests.support.waiting import eventually, job_when

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]
README_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def example() -> tuple[str, str, dict[str, object]]:
    """The README's consumer module, the module:attribute it is run as, and the job its curl
    request sends."""
    section = (ROOT / "README.md").read_text().split("## Example", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    target = re.search(r"python -m consumers_sdk (\S+):consumer", section)
    assert target is not None
    curl = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    words = shlex.split(curl)
    body = json.loads(words[words.index("-d") + 1])
    return code, target[1], body


async def test_the_readme_example_consumer_handles_the_job_its_curl_schedules(
    tmp_path: Path, make_run_node: DispatcherProcess, amqp_url: str
) -> None:
    code, module, body = example()
    assert README_AMQP_URL in code
    (tmp_path / f"{module}.py").write_text(code.replace(README_AMQP_URL, amqp_url))
    log = tmp_path / "consumer.log"
    consumer = spawn(
        ["-m", "consumers_sdk", f"{module}:consumer"], {"PYTHONPATH": str(tmp_path)}, log
    )
    try:
        await wait_for_consumer(amqp_url, "billing.orders.expire")
        body["delay_ms"] = 0  # the README's job is due in 30 s; the rest is as written
        async with httpx.AsyncClient(base_url=make_run_node.url, timeout=30) as http:
            created = await http.post("/v1/jobs", json=body)
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            await eventually(lambda: f"(job {job_id}, attempt 1)" in log.read_text(), 60)
            assert "expiring order 123" in log.read_text()
            done = await job_when(http, job_id, "succeeded", 60)
            assert [step["event"] for step in done["history"]][-1] == "succeeded"
    finally:
        consumer.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(consumer.wait, 30) == 0
