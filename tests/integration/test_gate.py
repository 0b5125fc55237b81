"""The gate on an in-process node with keys and a real PostgreSQL: the key is checked before a byte
of the body is read, each route's body has its own bound (413 naming it), and unknown tokens are
looked up at a bounded rate while a known key keeps working."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator

import orjson
import pytest

from dispatcher import api_keys, errors
from dispatcher import keyring as keyring_module
from dispatcher.api import gate
from dispatcher.node import Node
from dispatcher.store.api_keys import KeyStore
from dispatcher.store.db import Database
from tests.support.nodes import WRITE, client, running_node

ADMIN = "admin-token-0123456789"
LOOKUP_RATE = 5
CACHE_S = 0.3
MIB = 1024 * 1024


def bearer(token: str) -> dict[str, str]:
    return {**WRITE, "authorization": f"Bearer {token}"}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="gate",
        shard_count=8,
        api_keys=f"{ADMIN}:admin",
        api_key_cache_s=CACHE_S,
        api_key_lookup_rate=LOOKUP_RATE,
    ) as running:
        yield running


class Counted:
    """A request body streamed in chunks, counting how many the node pulled."""

    def __init__(self, total: int, chunk: int = 64 * 1024) -> None:
        self.total = total
        self.chunk = chunk
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.pulled < self.total:
            self.pulled += self.chunk
            yield b" " * self.chunk


async def test_an_anonymous_16_mib_body_is_refused_401_having_read_almost_nothing(
    node: Node,
) -> None:
    body = Counted(16 * MIB)
    headers = {**WRITE, "content-length": str(16 * MIB)}
    async with client(node) as http:
        response = await http.post("/v1/jobs/batch", content=body, headers=headers)
    assert response.status_code == 401, response.text
    assert response.headers["connection"] == "close"
    assert body.pulled == 0  # refused on its headers: not one chunk of the body was read


async def test_a_key_with_the_wrong_scope_is_refused_403_before_the_body(node: Node) -> None:
    _, monitor = await KeyStore(node.db).create(scope=api_keys.Scope.MONITOR, name="probe")
    body = Counted(4 * MIB)
    async with client(node) as http:
        response = await http.post(
            "/v1/jobs", content=body, headers={**bearer(monitor), "content-length": str(4 * MIB)}
        )
    assert response.status_code == 403, response.text
    assert body.pulled == 0


def limit_named(response_json: dict[str, object], limit: int) -> bool:
    return str(limit) in str(response_json["message"])


async def test_each_route_bounds_its_body_and_the_413_names_the_limit(node: Node) -> None:
    one_job = gate.document_bytes(node.settings)
    assert MIB < one_job < 2 * MIB  # about 1.1 MiB with the default limits
    padding = b" " * (one_job + 1)  # valid JSON once padded, so only the size is at fault
    job = orjson.dumps({"routing_key": "a", "payload": 1, "delay_ms": 600_000})
    async with client(node) as http:
        single = await http.post("/v1/jobs", content=job + padding, headers=bearer(ADMIN))
        batch = await http.post(
            "/v1/jobs/batch",
            content=b'{"jobs": [' + job + b"]}" + padding,
            headers=bearer(ADMIN),
        )
        cancel = await http.request(
            "DELETE", f"/v1/jobs/{uuid.uuid4()}", content=b" " * 1025, headers=bearer(ADMIN)
        )
        streamed = Counted(3 * one_job)  # chunked: no Content-Length, refused as it streams
        chunked = await http.post("/v1/jobs", content=streamed, headers=bearer(ADMIN))
    assert single.status_code == 413, single.text
    assert limit_named(single.json(), one_job)
    assert [f["field"] for f in single.json()["fields"]] == ["body"]
    assert batch.status_code == 201, batch.text  # a batch may be bigger than one job
    assert cancel.status_code == 413, cancel.text
    assert limit_named(cancel.json(), gate.SMALL_BODY_BYTES)
    assert chunked.status_code == 413, chunked.text
    assert limit_named(chunked.json(), one_job)
    assert streamed.pulled <= one_job + streamed.chunk  # stopped once past the bound


async def test_unknown_tokens_past_the_lookup_rate_get_429_while_a_known_key_keeps_working(
    node: Node,
) -> None:
    _, known = await KeyStore(node.db).create(scope=api_keys.Scope.PRODUCER, name="known")
    async with client(node) as http:
        assert (await http.get("/v1/jobs", headers=bearer(known))).status_code == 200
        await asyncio.sleep(CACHE_S + 0.1)  # its cached answer expires: the next use refreshes it
        strangers = [
            http.get("/v1/jobs", headers=bearer(f"dk_{uuid.uuid4().hex}")) for _ in range(40)
        ]
        started = time.monotonic()
        answers = await asyncio.gather(*strangers)
        took_s = time.monotonic() - started
        statuses = [answer.status_code for answer in answers]
        # The bucket is empty now: a known key's refresh is not held back.
        refreshed = [
            (await http.get("/v1/jobs", headers=bearer(known))).status_code for _ in range(3)
        ]
    looked_up = statuses.count(401)
    assert set(statuses) == {401, 429}, statuses
    # One second's burst, plus what refilled while they were answered (a slow machine's share).
    assert looked_up <= LOOKUP_RATE + math.ceil(took_s * LOOKUP_RATE) + 1
    throttled = next(answer for answer in answers if answer.status_code == 429)
    assert throttled.headers["retry-after"] == "1"
    assert throttled.json()["error"] == "too_many_requests"
    assert refreshed == [200, 200, 200]
    async with client(node) as http:
        metrics = (await http.get("/metrics", headers=bearer(ADMIN))).text
    assert 'dispatcher_http_refused_total{reason="lookup_rate"}' in metrics


async def test_a_full_key_cache_drops_only_unknown_tokens(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyring_module, "CACHE_ENTRIES", 50)
    db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await db.open()
    store = KeyStore(db)
    _, known = await store.create(scope=api_keys.Scope.PRODUCER, name="known")
    ring = keyring_module.Keyring(
        static=(), store=store, cache_s=600, required=True, lookup_rate=1000
    )
    assert (await ring.authenticate(known)).scope is api_keys.Scope.PRODUCER
    strangers = [f"dk_{uuid.uuid4().hex}" for _ in range(60)]  # past the cache's size
    for token in strangers:
        with pytest.raises(errors.Unauthenticated):
            await ring.authenticate(token)
    await db.close()  # from here on, only cached answers can be given
    assert (await ring.authenticate(known)).scope is api_keys.Scope.PRODUCER
    with pytest.raises(errors.StoreUnavailable):
        await ring.authenticate(strangers[0])  # dropped when the cache filled: asked again


async def test_a_key_found_valid_while_the_caches_are_dropped_stays_out_of_the_lookup_rate(
    database_url: str,
) -> None:
    """A key notice can arrive while a key is being looked up (the key just created, say): the
    answer is not cached, but the key stays known, so strangers cannot hold its refresh back."""
    db = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await db.open()
    try:
        store = KeyStore(db)
        _, known = await store.create(scope=api_keys.Scope.PRODUCER, name="known")
        ring = keyring_module.Keyring(
            static=(), store=store, cache_s=600, required=True, lookup_rate=2
        )
        looking = asyncio.create_task(ring.authenticate(known))
        await asyncio.sleep(0)  # the lookup's query is on its way
        ring.forget()  # as a key notice does
        assert (await looking).scope is api_keys.Scope.PRODUCER
        with pytest.raises(errors.Unauthenticated):
            await ring.authenticate(f"dk_{uuid.uuid4().hex}")  # the second lookup of this second
        with pytest.raises(errors.TooManyLookups):
            await ring.authenticate(f"dk_{uuid.uuid4().hex}")
        assert (await ring.authenticate(known)).scope is api_keys.Scope.PRODUCER  # asked again
    finally:
        await db.close()
