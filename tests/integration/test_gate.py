"""The gate on an in-process node with keys and a real PostgreSQL: the key is checked before a byte
of the body is read, each route's body has its own bound (413 naming it), and any token is
answered from the live keys held in memory: a flood of unknown ones costs no query and locks no
known key out."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from dispatcher import errors
from dispatcher.api import gate
from dispatcher.auth import api_keys
from dispatcher.auth import keyring as keyring_module
from dispatcher.node import Node
from dispatcher.store.api_keys import KeyStore
from dispatcher.store.db import Database
from tests.support.nodes import WRITE, client, running_node

ADMIN = "admin-token-0123456789"
CACHE_S = 0.3
LONG_CACHE_S = 60.0  # a key is known sooner only by its key notice
MIB = 1024 * 1024


def bearer(token: str) -> dict[str, str]:
    return {**WRITE, "authorization": f"Bearer {token}"}


def gate_node(
    database_url: str, amqp_url: str, *, cache_s: float
) -> contextlib.AbstractAsyncContextManager[Node]:
    """A node with the admin key, its keys cached CACHE_S."""
    return running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="gate",
        shard_count=8,
        api_keys=f"{ADMIN}:admin",
        api_key_cache_s=cache_s,
    )


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with gate_node(database_url, amqp_url, cache_s=CACHE_S) as running:
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
    _, monitor = await KeyStore(node.core.db).create(scope=api_keys.Scope.MONITOR, name="probe")
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


async def test_unknown_tokens_are_refused_from_memory_and_a_new_key_answers_at_once(
    database_url: str, amqp_url: str
) -> None:
    """A new key answers long before the keys' cache time is out (its key notice reloads them),
    even while unknown tokens flood the node: the bound is a quarter of that time, far from what
    a loaded machine adds."""
    async with (
        gate_node(database_url, amqp_url, cache_s=LONG_CACHE_S) as node,
        client(node) as http,
    ):
        refusals: set[int] = set()
        for _ in range(10):  # probed: a key created just before a flood got 429 ten times in ten
            _, known = await KeyStore(node.core.db).create(scope=api_keys.Scope.PRODUCER)
            created = time.monotonic()
            strangers = [
                http.get("/v1/jobs", headers=bearer(f"dk_{uuid.uuid4().hex}")) for _ in range(40)
            ]
            answers, took_s = await asyncio.gather(
                asyncio.gather(*strangers), answered_200(http, known, since=created)
            )
            # 401, or 503 while the one load of the keys the notice started takes more than
            # keyring.LOAD_WAIT_S (a loaded machine): never let in, never 429.
            refusals |= {answer.status_code for answer in answers}
            assert refusals <= {401, 503}, refusals
            assert took_s < LONG_CACHE_S / 4  # no cache time waited out
        assert 401 in refusals  # refused from the keys in memory
        metrics = (await http.get("/metrics", headers=bearer(ADMIN))).text
    assert "lookup_rate" not in metrics


async def answered_200(http: httpx.AsyncClient, token: str, *, since: float) -> float:
    """Seconds from ``since`` until ``token`` is answered 200 (asked every 10 ms)."""
    while (await http.get("/v1/jobs", headers=bearer(token))).status_code != 200:
        assert time.monotonic() - since < LONG_CACHE_S, "never answered 200"
        await asyncio.sleep(0.01)
    return time.monotonic() - since


class CountedStore(KeyStore):
    """The real store, counting its loads of the live keys."""

    loads = 0

    async def live(self) -> tuple[dict[bytes, api_keys.ApiKey], bool]:
        self.loads += 1
        return await super().live()


async def test_any_number_of_tokens_costs_one_load_and_a_notice_one_more(db: Database) -> None:
    store = CountedStore(db)
    _, known = await store.create(scope=api_keys.Scope.PRODUCER, name="known")
    ring = keyring_module.Keyring(static=(), store=store, cache_s=600)
    for _ in range(500):
        with pytest.raises(errors.Unauthenticated):
            await ring.authenticate(f"dk_{uuid.uuid4().hex}")
    assert (await ring.authenticate(known)).scope is api_keys.Scope.PRODUCER
    assert store.loads == 1
    _, newer = await store.create(scope=api_keys.Scope.PRODUCER, name="newer")
    ring.forget()  # as its key notice does
    found = await asyncio.gather(*(ring.authenticate(newer) for _ in range(20)))
    assert {principal.scope for principal in found} == {api_keys.Scope.PRODUCER}
    assert store.loads == 2  # the twenty shared one load
    assert ring.live_count >= 2


async def test_keys_past_their_cache_time_are_never_used_while_postgres_is_away(
    db: Database,
) -> None:
    store = KeyStore(db)
    _, known = await store.create(scope=api_keys.Scope.PRODUCER, name="known")
    static = api_keys.parse_static(f"{ADMIN}:admin")
    ring = keyring_module.Keyring(static=static, store=store, cache_s=0.2)
    assert (await ring.authenticate(known)).scope is api_keys.Scope.PRODUCER
    await db.close()
    assert (await ring.authenticate(known)).scope is api_keys.Scope.PRODUCER  # still fresh
    await asyncio.sleep(0.3)
    with pytest.raises(errors.StoreUnavailable):
        await ring.authenticate(known)
    with pytest.raises(errors.StoreUnavailable):
        await ring.authenticate(f"dk_{uuid.uuid4().hex}")  # nor is "unknown" said on a guess
    assert (await ring.authenticate(ADMIN)).scope is api_keys.Scope.ADMIN  # static: no query


async def test_a_load_that_a_notice_overtook_is_used_once_then_loaded_again(db: Database) -> None:
    """A key notice can arrive while the keys are being read (a key revoked meanwhile): the
    requests waiting get that read, the next one reads again."""

    class HeldStore(CountedStore):
        read = asyncio.Event()
        release = asyncio.Event()

        async def live(self) -> tuple[dict[bytes, api_keys.ApiKey], bool]:
            found = await super().live()
            self.read.set()
            await self.release.wait()
            return found

    store = HeldStore(db)
    key, token = await store.create(scope=api_keys.Scope.PRODUCER, name="known")
    ring = keyring_module.Keyring(static=(), store=store, cache_s=600)
    looking = asyncio.create_task(ring.authenticate(token))
    await store.read.wait()
    await store.revoke(key.id)
    ring.forget()  # the revocation's notice, while the load is still on its way
    store.release.set()
    assert (await looking).scope is api_keys.Scope.PRODUCER  # as read before the revocation
    with pytest.raises(errors.Unauthenticated):
        await ring.authenticate(token)
    assert store.loads == 2


async def test_a_request_waits_for_the_keys_a_second_at_most(db: Database) -> None:
    """A node cut from PostgreSQL: the load of the keys hangs until the pool gives up, but a
    request (its /readyz above all) is answered within a second: 503, or open if it was open."""

    class HangingStore(KeyStore):
        async def live(self) -> tuple[dict[bytes, api_keys.ApiKey], bool]:
            await asyncio.sleep(30)  # as a statement whose packets are dropped
            raise AssertionError("never answers")

    ring = keyring_module.Keyring(static=(), store=HangingStore(db), cache_s=0)
    started = time.monotonic()
    with pytest.raises(errors.StoreUnavailable):
        await ring.authenticate(f"dk_{uuid.uuid4().hex}")
    assert time.monotonic() - started < keyring_module.LOAD_WAIT_S + 0.5
    started = time.monotonic()  # the load still hangs: a later request does not wait again
    with pytest.raises(errors.StoreUnavailable):
        await ring.authenticate(f"dk_{uuid.uuid4().hex}")
    assert time.monotonic() - started < 0.2
    was_open = keyring_module.Keyring(static=(), store=KeyStore(db), cache_s=0)
    assert not await was_open.enabled()  # no key stored: open
    was_open._store = HangingStore(db)
    started = time.monotonic()
    assert not await was_open.enabled()  # open it was, open it stays
    assert time.monotonic() - started < keyring_module.LOAD_WAIT_S + 0.5
