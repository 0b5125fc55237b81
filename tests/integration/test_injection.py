"""Injection strings through every text field reach PostgreSQL only as parameters: each is stored
and returned verbatim, or refused cleanly (4xx, nothing stored), and the tables stay intact."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from dispatcher.auth import api_keys
from dispatcher.node import Node
from dispatcher.store.api_keys import KeyStore
from tests.support.nodes import client, running_node

INJECTIONS = [
    "'; DROP TABLE jobs; --",
    "' OR '1'='1",
    '" OR "1"="1',
    "$1",
    "$1::text); DELETE FROM api_keys; --",
    "\\'; SELECT pg_sleep(5); --",
    "\\\\x00\\",
    "1; TRUNCATE shard_epochs CASCADE",
    "%s %d %(name)s {0}",
    "Robert'); DROP TABLE schema_migrations;--",
    "ünïcødé ☃ 😀 مرحبا \u202e",
    "a" * 200 + "'--",
]
NUL = "before\x00after"


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="injection",
        shard_count=4,
        api_key_cache_s=0,  # keys created by a test count at once
    ) as running:
        yield running


async def table_counts(database_url: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        return {
            table: int(await connection.fetchval(f"SELECT count(*) FROM {table}"))
            for table in ("jobs", "api_keys", "shard_epochs", "schema_migrations")
        }
    finally:
        await connection.close()


async def test_injection_strings_in_job_text_fields_are_stored_verbatim(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        for number, text in enumerate(INJECTIONS):
            body = {
                "routing_key": "orders.injection",
                "payload": {text: text, "list": [text, NUL], "nul": NUL},
                "delay_ms": 600_000,
                "idempotency_key": text,
                "headers": {f"h-{number}": text, text[:100]: "value"},
            }
            created = await http.post("/v1/jobs", json=body)
            assert created.status_code == 201, created.text
            job = created.json()
            assert job["payload"] == body["payload"]
            assert job["headers"] == body["headers"]
            assert job["idempotency_key"] == text
            fetched = (await http.get(f"/v1/jobs/{job['id']}")).json()
            assert (fetched["payload"], fetched["headers"]) == (body["payload"], body["headers"])
            again = await http.post("/v1/jobs", json={**body, "payload": "other"})
            assert (again.status_code, again.json()["id"]) == (200, job["id"])
    counts = await table_counts(database_url)
    assert counts["jobs"] == len(INJECTIONS)
    assert counts["shard_epochs"] == 4


async def test_injection_strings_as_routing_keys_are_refused_and_store_nothing(
    node: Node, database_url: str
) -> None:
    before = await table_counts(database_url)
    async with client(node) as http:
        for text in [*INJECTIONS, NUL]:
            single = await http.post("/v1/jobs", json={"routing_key": text, "payload": 1})
            assert single.status_code == 422, single.text
            assert single.json()["fields"][0]["field"] == "routing_key"
            batch = await http.post(
                "/v1/jobs/batch",
                json={"jobs": [{"routing_key": "a.b", "payload": 1}, {"routing_key": text}]},
            )
            assert batch.status_code == 422
    assert await table_counts(database_url) == before


async def test_nul_in_fields_stored_as_text_is_refused_by_name(
    node: Node, database_url: str
) -> None:
    before = await table_counts(database_url)
    async with client(node) as http:
        for field, value in [
            ("idempotency_key", NUL),
            ("headers", {"name": NUL}),
            ("headers", {NUL: "value"}),
        ]:
            answer = await http.post(
                "/v1/jobs", json={"routing_key": "a.b", "payload": 1, field: value}
            )
            assert answer.status_code == 422, answer.text
            assert answer.json()["fields"][0]["field"].startswith(field)
        listed = await http.get("/v1/jobs", params={"routing_key": NUL})
        assert listed.status_code == 422
    assert await table_counts(database_url) == before


async def test_injection_strings_as_list_filters_match_nothing_or_are_refused(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        stored = await http.post("/v1/jobs", json={"routing_key": "a.b", "payload": 1})
        assert stored.status_code == 201
        for text in INJECTIONS:
            by_key = await http.get("/v1/jobs", params={"routing_key": text})
            if by_key.status_code == 200:
                assert by_key.json()["jobs"] == []
            else:  # not a routing key at all
                assert by_key.status_code == 422
                assert by_key.json()["fields"][0]["field"] == "routing_key"
            by_state = await http.get("/v1/jobs", params={"state": text})
            assert by_state.status_code == 422
            assert by_state.json()["fields"][0]["field"] == "state"
            by_id = await http.get(f"/v1/jobs/{text}")
            assert by_id.status_code in (404, 422)
        everything = (await http.get("/v1/jobs")).json()["jobs"]
    assert [job["id"] for job in everything] == [stored.json()["id"]]
    assert (await table_counts(database_url))["jobs"] == 1


async def test_injection_strings_as_key_names_and_bearer_tokens_change_nothing(
    node: Node, database_url: str
) -> None:
    store = KeyStore(node.core.db)
    for text in INJECTIONS:
        await store.create(scope=api_keys.Scope.PRODUCER, name=text)
    assert [key.name for key in await store.list()] == INJECTIONS
    for text in INJECTIONS:
        with pytest.raises(ValueError, match="namespace"):
            await store.create(scope=api_keys.Scope.PRODUCER, namespace=text)
        with pytest.raises(ValueError, match="routing-key prefix"):
            await store.create(scope=api_keys.Scope.PRODUCER, routing_key_prefixes=[text])
    async with client(node) as http:
        for text in INJECTIONS:
            header = b"Bearer " + text.encode()  # raw bytes: HTTP headers are not UTF-8 text
            answer = await http.get("/v1/jobs", headers={"authorization": header})
            assert answer.status_code == 401
    counts = await table_counts(database_url)
    assert counts["api_keys"] == len(INJECTIONS)
    assert counts["jobs"] == 0
