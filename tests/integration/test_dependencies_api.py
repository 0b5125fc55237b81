"""`after` through the HTTP API of an in-process node: validation at the edge (422 naming
`after[i]`, nothing stored), namespaces, the `waiting` state, and DELETE of a waiting job."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from dispatcher.node import Node
from tests.support.nodes import client, running_node

TEAM_A = "producer-a-token-0123456789"
TEAM_B = "producer-b-token-0123456789"
ADMIN = "admin-token-0123456789"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def job(*after: str, **fields: object) -> dict[str, object]:
    return {"routing_key": "orders.expire", "payload": {}, "after": list(after), **fields}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="deps",
        shard_count=4,
        api_keys=f"{TEAM_A}:producer:team-a,{TEAM_B}:producer:team-b,{ADMIN}:admin",
    ) as running:
        yield running


@pytest.fixture
async def http(node: Node) -> AsyncIterator[httpx.AsyncClient]:
    async with client(node) as api:
        api.headers.update(bearer(TEAM_A))
        yield api


async def counts(database_url: str) -> tuple[int, int]:
    connection = await asyncpg.connect(database_url)
    try:
        jobs = await connection.fetchval("SELECT count(*) FROM jobs")
        edges = await connection.fetchval("SELECT count(*) FROM job_dependencies")
        return jobs, edges
    finally:
        await connection.close()


async def created(http: httpx.AsyncClient, body: dict[str, object]) -> dict[str, Any]:
    response = await http.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    document: dict[str, Any] = response.json()
    return document


def refused_field(response: httpx.Response) -> str:
    assert response.status_code == 422, response.text
    [named] = response.json()["fields"]
    return str(named["field"])


async def test_a_waiting_job_shows_what_it_waits_for_and_is_listed_as_waiting(
    http: httpx.AsyncClient,
) -> None:
    a = await created(http, job(delay_ms=600_000))
    b = await created(http, job(a["id"]))
    assert b["state"] == "waiting"
    shown = (await http.get(f"/v1/jobs/{b['id']}")).json()
    assert (shown["state"], shown["after"], shown["pending"]) == ("waiting", [a["id"]], [a["id"]])
    assert (await http.get(f"/v1/jobs/{a['id']}")).json()["after"] == []
    listed = (await http.get("/v1/jobs", params={"state": "waiting"})).json()["jobs"]
    assert [j["id"] for j in listed] == [b["id"]]


async def test_unknown_repeated_or_too_many_prerequisites_are_refused_naming_the_field(
    http: httpx.AsyncClient, database_url: str
) -> None:
    a = await created(http, job(delay_ms=600_000))
    before = await counts(database_url)
    unknown = str(uuid.uuid4())
    assert refused_field(await http.post("/v1/jobs", json=job(a["id"], unknown))) == "after[1]"
    assert refused_field(await http.post("/v1/jobs", json=job(a["id"], a["id"]))) == "after[1]"
    many = [str(uuid.uuid4()) for _ in range(101)]
    assert refused_field(await http.post("/v1/jobs", json=job(*many))) == "after"
    assert refused_field(await http.post("/v1/jobs", json=job("not-a-uuid"))) == "after[0]"
    batch = {"jobs": [job(a["id"]), job(), job(unknown)]}
    assert refused_field(await http.post("/v1/jobs/batch", json=batch)) == "jobs[2].after[0]"
    assert await counts(database_url) == before


async def test_a_job_cannot_wait_for_itself_through_its_idempotency_key(
    http: httpx.AsyncClient, database_url: str
) -> None:
    first = await created(http, job(idempotency_key="nightly"))
    before = await counts(database_url)
    again = await http.post("/v1/jobs", json=job(first["id"], idempotency_key="nightly"))
    assert refused_field(again) == "after[0]"
    assert "itself" in again.json()["message"]
    assert await counts(database_url) == before


async def test_a_job_of_another_namespace_cannot_be_waited_for(
    node: Node, http: httpx.AsyncClient, database_url: str
) -> None:
    a = await created(http, job(delay_ms=600_000))
    before = await counts(database_url)
    async with client(node) as other:
        refused = await other.post("/v1/jobs", json=job(a["id"]), headers=bearer(TEAM_B))
        assert refused_field(refused) == "after[0]"
        assert "no job" in refused.json()["message"]
    assert await counts(database_url) == before


async def test_a_prerequisite_that_can_no_longer_succeed_is_refused(
    http: httpx.AsyncClient, database_url: str
) -> None:
    a = await created(http, job(delay_ms=600_000))
    assert (await http.delete(f"/v1/jobs/{a['id']}")).status_code == 200
    refused = await http.post("/v1/jobs", json=job(a["id"]))
    assert refused_field(refused) == "after[0]"
    assert "cancelled" in refused.json()["message"]


async def test_deleting_a_waiting_job_cancels_it_and_the_jobs_waiting_for_it(
    http: httpx.AsyncClient,
) -> None:
    a = await created(http, job(delay_ms=600_000))
    b = await created(http, job(a["id"]))
    c = await created(http, job(b["id"]))
    cancelled = await http.delete(f"/v1/jobs/{b['id']}")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    shown = (await http.get(f"/v1/jobs/{c['id']}")).json()
    assert (shown["state"], shown["last_error"]) == (
        "cancelled",
        f"prerequisite {b['id']} cancelled",
    )
    assert [s["event"] for s in shown["history"]][-1] == "cancelled"
    assert (await http.get(f"/v1/jobs/{a['id']}")).json()["state"] == "scheduled"
