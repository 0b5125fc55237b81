"""A request cannot forge log lines: a real node logs a refused request whose path carries line
breaks (LF, CRLF, NEL, U+2028) as exactly one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.dispatcher_process import DispatcherProcess
from tests.support.process import served
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e
ADMIN = "admin-token-0123456789abcdef"
# Each breaks a line in some log viewer; after it, what a forged line would say.
BREAKS = {"lf": "%0A", "crlf": "%0D%0A", "nel": "%C2%85", "u2028": "%E2%80%A8"}
FORGED = "2030-01-01 00:00:00,000 INFO dispatcher.node: forged-"


@pytest.fixture
def dispatcher(tmp_path: Path, database_url: str, amqp_url: str) -> Iterator[DispatcherProcess]:
    """A node with a key, so that a request without one is refused (and logged)."""
    env = {"DISPATCHER_API_KEYS": f"{ADMIN}:admin"}
    yield from served(tmp_path, database_url, amqp_url, env=env, api_key=ADMIN)


async def test_a_refused_request_with_line_breaks_in_its_path_logs_one_line(
    dispatcher: DispatcherProcess,
) -> None:
    async with httpx.AsyncClient(base_url=dispatcher.url, timeout=10) as http:
        for name, line_break in BREAKS.items():
            forged = FORGED.replace(" ", "%20") + name
            response = await http.get(f"/v1/jobs/marker-{name}{line_break}{forged}")
            assert response.status_code == 401, name

    def lines() -> list[str]:
        return dispatcher.logs(tail=100_000).splitlines()

    await eventually(
        lambda: all(any(f"marker-{n}" in line for line in lines()) for n in BREAKS), 30
    )
    for name in BREAKS:
        logged = [line for line in lines() if f"-{name}" in line]
        assert len(logged) == 1, (name, logged)
        assert "refused GET /v1/jobs/marker-" in logged[0]
        assert f"forged-{name}" in logged[0]
    assert not [line for line in lines() if line.startswith(FORGED[:10])]
