"""A client generated from a real node's OpenAPI document by openapi-python-client (offline,
into a temporary folder) reads every answer: a repeated idempotency key gives the stored job
back, parsed, not None; the job reads back; a page lists it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.dispatcher_process import DispatcherProcess

pytestmark = pytest.mark.e2e
GENERATOR = Path(sys.executable).parent / "openapi-python-client"
PACKAGE = "dispatcher_client"


@pytest.fixture
def generated(
    dispatcher: DispatcherProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """The client package generated from the node's /openapi.json, importable while the test
    runs (no formatter hooks: nothing but the generator runs)."""
    spec = tmp_path / "openapi.json"
    spec.write_bytes(httpx.get(f"{dispatcher.url}/openapi.json", timeout=30).content)
    config = tmp_path / "generator.yml"
    config.write_text(f"package_name_override: {PACKAGE}\npost_hooks: []\n")
    package = tmp_path / PACKAGE
    ran = subprocess.run(
        [
            str(GENERATOR),
            "generate",
            "--path",
            str(spec),
            "--meta",
            "none",
            "--fail-on-warning",
            "--output-path",
            str(package),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


async def test_a_generated_client_parses_the_answer_to_a_repeated_idempotency_key(
    dispatcher: DispatcherProcess, generated: Path
) -> None:
    from dispatcher_client import Client
    from dispatcher_client.api.jobs import (
        create_job_v1_jobs_post,
        get_job_v1_jobs_job_id_get,
        list_jobs_v1_jobs_get,
    )
    from dispatcher_client.models import (
        JobCreate,
        JobPage,
        JobSubmitted,
        JobWithHistory,
    )

    body = JobCreate.from_dict(
        {
            "routing_key": "orders.generated",
            "payload": {"order": 1},
            "delay_ms": 3_600_000,
            "idempotency_key": "generated-client-1",
        }
    )
    # Closed at the end: the generated client owns an httpx client.
    async with Client(base_url=dispatcher.url, timeout=httpx.Timeout(30.0)) as client:
        first = await create_job_v1_jobs_post.asyncio_detailed(client=client, body=body)
        again = await create_job_v1_jobs_post.asyncio_detailed(client=client, body=body)
        assert [first.status_code, again.status_code] == [201, 200], again.content
        assert isinstance(first.parsed, JobSubmitted), first.content
        assert isinstance(again.parsed, JobSubmitted), again.content  # was None: no schema
        assert (again.parsed.id, again.parsed.created) == (first.parsed.id, False)
        job = await get_job_v1_jobs_job_id_get.asyncio(client=client, job_id=first.parsed.id)
        assert isinstance(job, JobWithHistory)
        assert (job.id, job.routing_key, job.state) == (
            first.parsed.id,
            "orders.generated",
            "scheduled",
        )
        page = await list_jobs_v1_jobs_get.asyncio(
            client=client, idempotency_key="generated-client-1"
        )
        assert isinstance(page, JobPage)
        assert [listed.id for listed in page.jobs] == [first.parsed.id]
