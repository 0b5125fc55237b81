"""The lean path of ``POST /v1/jobs`` (``api.lean``): what it serves itself and what it hands to the
FastAPI route, byte for byte. Over a real PostgreSQL; the route behind it is a recorder here, so a
request the lean path served is one the recorder never saw."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from dispatcher.api import auth, lean
from dispatcher.api.context import ApiContext
from dispatcher.auth import api_keys
from dispatcher.store.db import Database
from tests.support import api_context
from tests.support.nodes import WRITE, jobs_stored

JOB = {"routing_key": "lean.work", "payload": {"n": 1}, "delay_ms": 600_000}


class Route:
    """Stands for the FastAPI app behind the lean path: records the bodies it was handed."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"route"})


class Admitted:
    """Puts the caller in the request's state as the gate does (None: nobody admitted)."""

    def __init__(self, app: lean.LeanSubmit, caller: api_keys.Principal | None) -> None:
        self._app = app
        self.caller = caller

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.caller is not None:
            scope.setdefault("state", {})[auth.PRINCIPAL] = self.caller
        await self._app(scope, receive, send)


def principal(scope: api_keys.Scope, prefixes: tuple[str, ...] = ()) -> api_keys.Principal:
    return api_keys.Principal(key="t", scope=scope, routing_key_prefixes=prefixes)


@pytest.fixture
def context(database_url: str, db: Database) -> ApiContext:
    return api_context.build(database_url, db, api_context.Checks())


@pytest.fixture
def route() -> Route:
    return Route()


@pytest.fixture
def admitted(context: ApiContext, route: Route) -> Admitted:
    api_route = APIRoute(lean.PATH, endpoint=lambda: None, methods=["POST"])
    return Admitted(
        lean.LeanSubmit(route, context=context, route=api_route), principal(api_keys.Scope.PRODUCER)
    )


@pytest.fixture
async def http(admitted: Admitted) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=admitted)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client


async def test_a_valid_job_is_stored_and_answered_without_the_route(
    http: httpx.AsyncClient, route: Route, database_url: str
) -> None:
    answer = await http.post(lean.PATH, json=JOB, headers=WRITE)
    assert answer.status_code == 201, answer.text
    assert answer.json()["routing_key"] == "lean.work"
    assert answer.json()["payload"] == {"n": 1}
    assert answer.json()["created"] is True
    assert route.bodies == []
    assert await jobs_stored(database_url) == 1


@pytest.mark.parametrize(
    "body",
    [
        b'{"routing_key": "lean.work", "payload": 1, "delay_ms": -1}',  # a field refused
        b'{"routing_key": "lean.work", "payload": 1, "colour": "red"}',  # an unknown field
        b'{"routing_key": "lean.work", "payload": ',  # not JSON
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser goes
        b'{"routing_key": "lean.work", "payload": "\xff"}',  # not UTF-8
        b"",
    ],
    ids=["field", "unknown", "malformed", "deep", "not-utf8", "empty"],
)
async def test_a_request_the_model_refuses_goes_to_the_route_with_its_body_unchanged(
    http: httpx.AsyncClient, route: Route, database_url: str, body: bytes
) -> None:
    answer = await http.post(lean.PATH, content=body, headers=WRITE)
    assert (answer.status_code, answer.text) == (299, "route")
    assert route.bodies == [body]
    assert await jobs_stored(database_url) == 0


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("POST", "/v1/jobs/batch", WRITE),
        ("POST", "/v1/jobs/", WRITE),
        ("PUT", lean.PATH, WRITE),
        ("POST", lean.PATH, {"content-type": "text/plain"}),
        ("POST", lean.PATH, {}),
    ],
    ids=["batch", "slash", "put", "text", "no-type"],
)
async def test_other_requests_go_to_the_route(
    http: httpx.AsyncClient, route: Route, method: str, path: str, headers: dict[str, str]
) -> None:
    body = json.dumps(JOB).encode()
    answer = await http.request(method, path, content=body, headers=headers)
    assert answer.status_code == 299
    assert route.bodies == [body]


@pytest.mark.parametrize(
    "caller", [None, principal(api_keys.Scope.MONITOR)], ids=["none", "monitor"]
)
async def test_a_caller_the_gate_did_not_admit_as_a_producer_goes_to_the_route(
    http: httpx.AsyncClient,
    admitted: Admitted,
    route: Route,
    database_url: str,
    caller: api_keys.Principal | None,
) -> None:
    admitted.caller = caller
    answer = await http.post(lean.PATH, json=JOB, headers=WRITE)
    assert answer.status_code == 299
    assert len(route.bodies) == 1
    assert await jobs_stored(database_url) == 0


async def test_a_refusal_after_validation_is_answered_by_the_lean_path_naming_the_field(
    http: httpx.AsyncClient, admitted: Admitted, route: Route, database_url: str
) -> None:
    admitted.caller = principal(api_keys.Scope.PRODUCER, prefixes=("billing.",))
    answer = await http.post(lean.PATH, json=JOB, headers=WRITE)
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"] == "forbidden"
    assert answer.json()["fields"][0]["field"] == "routing_key"
    too_big = {**JOB, "routing_key": "billing.x", "payload": "x" * 2_000_000}
    answer = await http.post(lean.PATH, json=too_big, headers=WRITE)
    assert answer.status_code == 413, answer.text
    assert answer.json()["fields"][0]["field"] == "payload"
    assert route.bodies == []
    assert await jobs_stored(database_url) == 0
