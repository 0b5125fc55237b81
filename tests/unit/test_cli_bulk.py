"""``dispatcher jobs bulk``: a dry run's count first, nothing changed without a confirmation, then
the action followed to its end (plain lines without a terminal). The API is answered here as
tests/integration/test_bulk_actions.py shows the node answers it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from dispatcher.cli import bulk, http
from dispatcher.cli.main import build_parser

ACTION_ID = "0b6d5f0e-4a57-4f55-a1e8-8d1f0f4b8a11"


class FakeApi:
    """Answers /v1/bulk-actions: a dry run of 3 jobs, an action done at the second look."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.looks = 0

    def action(self, status: str, touched: int) -> dict[str, Any]:
        return {
            "id": ACTION_ID,
            "action": "requeue",
            "status": status,
            "touched": touched,
            "matched_estimate": 3,
            "created_by": "admin",
            "created_at": "2026-11-29T12:00:00Z",
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        if request.method == "POST" and body.get("dry_run"):
            sample = [
                {
                    "id": f"job-{n}",
                    "state": "dead",
                    "routing_key": "billing.charge",
                    "run_at": "2026-11-29T11:00:00Z",
                    "last_error": "timeout",
                }
                for n in range(3)
            ]
            return httpx.Response(200, json={"action": "requeue", "matched": 3, "sample": sample})
        if request.method == "POST":
            return httpx.Response(202, json=self.action("running", 0))
        self.looks += 1
        return httpx.Response(
            200, json=self.action("done", 3) if self.looks > 1 else self.action("running", 1)
        )


def run(argv: list[str], api: FakeApi) -> int:
    args = build_parser().parse_args(["jobs", "bulk", *argv])
    with httpx.Client(base_url="http://dispatcher", transport=httpx.MockTransport(api)) as client:
        return bulk.run(client, args, http._check)


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "POLL_S", 0.0)
    monkeypatch.setattr(bulk, "LINE_EVERY_S", 0.0)


def test_without_a_terminal_nothing_changes_without_yes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = FakeApi()
    assert run(["requeue", "--routing-key-prefix", "billing"], api) == 1
    assert [(method, body.get("dry_run")) for method, _, body in api.requests] == [("POST", True)]
    err = capsys.readouterr().err
    assert "3 jobs match" in err
    assert "pass --yes" in err


def test_a_dry_run_shows_the_count_and_the_first_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    assert run(["requeue", "--error-contains", "timeout", "--dry-run"], api) == 0
    assert len(api.requests) == 1
    assert api.requests[0][2]["filter"] == {"error_contains": "timeout"}
    assert "job-0" in capsys.readouterr().err


def test_yes_starts_the_action_and_follows_it_to_its_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = FakeApi()
    argv = ["requeue", "--routing-key-prefix", "billing", "--finished-from", "2026-11-29T10:00Z"]
    assert run([*argv, "--yes"], api) == 0
    started = api.requests[1]
    assert started[:2] == ("POST", "/v1/bulk-actions")
    assert started[2] == {
        "action": "requeue",
        "filter": {"routing_key_prefix": "billing", "finished_from": "2026-11-29T10:00Z"},
    }
    out, err = capsys.readouterr()
    assert "1/3 jobs" in err  # a plain progress line: stderr is no terminal
    assert out.strip() == f"done: 3 jobs requeued (bulk action {ACTION_ID})"


def test_a_reschedule_sends_its_shift() -> None:
    api = FakeApi()
    run(["reschedule", "--routing-key", "a.b", "--shift", "3600", "--yes", "--no-wait"], api)
    assert api.requests[1][2] == {
        "action": "reschedule",
        "filter": {"routing_key": "a.b"},
        "shift_s": 3600.0,
    }
