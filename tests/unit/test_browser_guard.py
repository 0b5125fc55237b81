"""BrowserGuard in front of a tiny app: what a cross-site form could send never reaches the app;
JSON writes, body-less writes with a JSON type or a bearer key, and reads do. Host parsing."""

from __future__ import annotations

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from dispatcher.api import hosts
from dispatcher.api.browsers import BrowserGuard


class Recorder:
    """The app behind the guard: counts what reached it and answers 200."""

    def __init__(self) -> None:
        self.reached = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.reached += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def guarded(allowed: str = "") -> tuple[httpx.AsyncClient, Recorder, list[str]]:
    app = Recorder()
    refused: list[str] = []
    guard = BrowserGuard(app, allowed_hosts=hosts.parse_allowed(allowed), refused=refused.append)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://node")
    return client, app, refused


FORMS = [
    ("text/plain", b"{}"),
    ("application/x-www-form-urlencoded", b"a=1"),
    ("multipart/form-data; boundary=x", b"--x\r\n\r\n--x--"),
    (None, b"{}"),
]


@pytest.mark.parametrize(
    ("content_type", "body"), FORMS, ids=["text", "urlencoded", "multipart", "none"]
)
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_a_write_whose_body_is_not_json_is_refused_415_naming_content_type(
    method: str, content_type: str | None, body: bytes
) -> None:
    client, app, refused = guarded()
    headers = {"content-type": content_type} if content_type else {}
    async with client:
        response = await client.request(method, "/v1/jobs", content=body, headers=headers)
    assert response.status_code == 415, response.text
    assert [f["field"] for f in response.json()["fields"]] == ["content-type"]
    assert response.headers["connection"] == "close"
    assert app.reached == 0
    assert refused == ["content_type"]


async def test_a_bearer_key_does_not_excuse_a_form_body() -> None:
    client, app, _ = guarded()
    async with client:
        response = await client.post(
            "/v1/jobs",
            content=b"a=1",
            headers={"content-type": "text/plain", "authorization": "Bearer k" * 3},
        )
    assert response.status_code == 415
    assert app.reached == 0


@pytest.mark.parametrize("method", ["POST", "DELETE"])
async def test_a_body_less_write_needs_a_json_type_or_a_bearer_key(method: str) -> None:
    client, app, _ = guarded()
    async with client:
        bare = await client.request(method, "/v1/jobs/x")
        typed = await client.request(
            method, "/v1/jobs/x", headers={"content-type": "application/json; charset=utf-8"}
        )
        keyed = await client.request(method, "/v1/jobs/x", headers={"authorization": "Bearer abc"})
    assert bare.status_code == 415
    assert "application/json" in bare.json()["message"]
    assert [f["field"] for f in bare.json()["fields"]] == ["content-type"]
    assert (typed.status_code, keyed.status_code) == (200, 200)
    assert app.reached == 2


async def test_json_writes_and_reads_pass() -> None:
    client, app, refused = guarded()
    async with client:
        assert (await client.post("/v1/jobs", json={"a": 1})).status_code == 200
        assert (await client.get("/v1/jobs")).status_code == 200
    assert app.reached == 2
    assert refused == []


async def test_a_host_not_listed_is_refused_400_naming_it_and_healthz_is_exempt() -> None:
    client, app, refused = guarded("dispatcher.internal, 127.0.0.1:8080")
    async with client:
        listed = await client.get("/v1/jobs", headers={"host": "Dispatcher.Internal:9999"})
        port = await client.get("/v1/jobs", headers={"host": "127.0.0.1:8080"})
        wrong_port = await client.get("/v1/jobs", headers={"host": "127.0.0.1:8081"})
        rebound = await client.get("/v1/jobs", headers={"host": "evil.example"})
        health = await client.get("/healthz", headers={"host": "evil.example"})
    assert (listed.status_code, port.status_code, health.status_code) == (200, 200, 200)
    assert wrong_port.status_code == 400
    assert rebound.status_code == 400
    assert [f["field"] for f in rebound.json()["fields"]] == ["host"]
    assert "evil.example" in rebound.json()["message"]
    assert app.reached == 3
    assert refused == ["host", "host"]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("example.org", ("example.org", None)),
        ("Example.ORG.:8080", ("example.org", 8080)),
        ("[::1]:9000", ("::1", 9000)),
        ("[::1]", ("::1", None)),
        ("::1", ("::1", None)),
    ],
)
def test_host_headers_split_into_name_and_port(
    header: str, expected: tuple[str, int | None]
) -> None:
    assert hosts.split(header) == expected


@pytest.mark.parametrize("text", ["a:b", ":80", "[::1]x"])
def test_a_bad_allowed_hosts_entry_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match=r"host|port"):
        hosts.parse_allowed(text)
