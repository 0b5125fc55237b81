"""API keys against an in-process node and a real PostgreSQL: 401/403, namespaces, routing-key
prefixes, stored keys and their revocation, the `dispatcher keys` command, and no key in logs or
metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from consumers_sdk import AccessDenied, DispatcherClient
from devstack.postgres import PostgresServer
from dispatcher.auth import api_keys
from dispatcher.node import Node
from dispatcher.store.api_keys import KeyStore
from tests.support.nodes import WRITE, client, running_node

ADMIN = "admin-token-0123456789"
MONITOR = "monitor-token-0123456789"
PRODUCER_A = "producer-a-token-0123456789"
PRODUCER_B = "producer-b-token-0123456789"
PRODUCER = "producer-default-token-0123"
PREFIXED = "producer-prefixed-token-012"
API_KEYS = ",".join(
    [
        f"{ADMIN}:admin",
        f"{MONITOR}:monitor",
        f"{PRODUCER_A}:producer:team-a",
        f"{PRODUCER_B}:producer:team-b",
        f"{PRODUCER}:producer",
        f"{PREFIXED}:producer:team-a:billing.|audit:trail",
    ]
)
CACHE_S = 0.5
UNKNOWN_ID = "01890000-0000-7000-8000-000000000000"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def job(routing_key: str = "orders.expire", **fields: object) -> dict[str, object]:
    return {"routing_key": routing_key, "payload": {"n": 1}, "delay_ms": 600_000, **fields}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    """A node with static keys of every kind."""
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="auth",
        shard_count=4,
        api_keys=API_KEYS,
        api_key_cache_s=CACHE_S,
    ) as running:
        yield running


@pytest.fixture
async def keyless_node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    """A node with no static key: auth depends on the keys stored in PostgreSQL."""
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="auth-db",
        shard_count=4,
        api_key_cache_s=CACHE_S,
    ) as running:
        yield running


async def wait_for_status(
    http: httpx.AsyncClient, status: int, headers: dict[str, str], deadline_s: float
) -> float:
    """Seconds until GET /v1/jobs answers ``status`` with these headers."""
    start = time.monotonic()
    async with asyncio.timeout(deadline_s):
        while True:
            if (await http.get("/v1/jobs", headers=headers)).status_code == status:
                return time.monotonic() - start
            await asyncio.sleep(0.05)


async def test_without_keys_the_api_stays_open_and_readyz_says_auth_is_off(
    keyless_node: Node,
) -> None:
    async with client(keyless_node) as http:
        assert (await http.post("/v1/jobs", json=job())).status_code == 201
        assert (await http.get("/v1/cluster")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        ready = await http.get("/readyz")
    assert ready.json()["auth"] == "off"


async def test_every_endpoint_but_healthz_answers_401_without_a_valid_key(node: Node) -> None:
    # Every documented endpoint, so one added later is checked too.
    routes = node.serving.app.fastapi.openapi()["paths"]
    checked = set()
    async with client(node) as http:
        for route, methods in routes.items():
            path = route.replace("{job_id}", UNKNOWN_ID)
            for method in methods:
                for headers in ({}, bearer(ADMIN + "x"), {"authorization": f"Basic {ADMIN}"}):
                    answer = await http.request(method, path, headers=headers, json={})
                    if route == "/healthz":
                        assert answer.status_code == 200
                        continue
                    assert answer.status_code == 401, (method, path, answer.text)
                    assert answer.headers["www-authenticate"] == "Bearer"
                    assert answer.json()["error"] == "unauthenticated"
                    assert (
                        "Bearer" in answer.json()["message"]
                        or "not valid" in (answer.json()["message"])
                    )
                checked.add(route)
        ready = await http.get("/readyz", headers=bearer(PRODUCER))
    assert checked >= {"/v1/jobs", "/v1/jobs/batch", "/v1/jobs/{job_id}", "/v1/cluster"}
    assert checked >= {"/healthz", "/readyz", "/metrics"}
    assert ready.json()["auth"] == "on"


def not_ready(answer: httpx.Response) -> bool:
    return answer.status_code == 503 and answer.json().get("status") == "not ready"


async def test_a_key_without_the_needed_scope_answers_403(node: Node) -> None:
    expected = [
        (PRODUCER, "GET", "/v1/cluster", 403),
        (PRODUCER, "GET", "/metrics", 403),
        (PRODUCER, "GET", "/readyz", 200),
        (PRODUCER, "GET", "/v1/jobs", 200),
        (MONITOR, "GET", "/metrics", 200),
        (MONITOR, "GET", "/readyz", 200),
        (MONITOR, "POST", "/v1/jobs", 403),
        (MONITOR, "POST", "/v1/jobs/batch", 403),
        (MONITOR, "GET", "/v1/jobs", 403),
        (MONITOR, "GET", f"/v1/jobs/{UNKNOWN_ID}", 403),
        (MONITOR, "DELETE", f"/v1/jobs/{UNKNOWN_ID}", 403),
        (MONITOR, "GET", "/v1/cluster", 403),
        (ADMIN, "GET", "/v1/cluster", 200),
        (ADMIN, "GET", "/metrics", 200),
        (ADMIN, "POST", "/v1/jobs", 201),
        (ADMIN, "GET", "/v1/jobs", 200),
    ]
    async with client(node) as http:
        for token, method, path, status in expected:
            body = {"jobs": [job()]} if path.endswith("batch") else job()
            answer = await http.request(method, path, headers=bearer(token), json=body)
            deadline = time.monotonic() + 20
            # Readiness follows the services' probes (a loaded broker's may miss its 2 s for a
            # moment); a key's scope does not: /readyz is asked again while it says not ready.
            while path == "/readyz" and not_ready(answer) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                answer = await http.request(method, path, headers=bearer(token))
            assert answer.status_code == status, (token, method, path, answer.text)
            if status == 403:
                assert answer.json()["error"] == "forbidden"
                assert "scope" in answer.json()["message"]


async def test_a_namespaced_producer_sees_and_cancels_only_its_namespace(node: Node) -> None:
    async with client(node) as http:
        mine = (await http.post("/v1/jobs", json=job(), headers=bearer(PRODUCER_A))).json()
        theirs = (await http.post("/v1/jobs", json=job(), headers=bearer(PRODUCER_B))).json()
        default = (await http.post("/v1/jobs", json=job(), headers=bearer(PRODUCER))).json()
        assert (mine["namespace"], theirs["namespace"], default["namespace"]) == (
            "team-a",
            "team-b",
            None,
        )
        # Another namespace's job does not exist for this key: 404, never 403, so ids leak nothing.
        for other in (theirs, default):
            got = await http.get(f"/v1/jobs/{other['id']}", headers=bearer(PRODUCER_A))
            assert got.status_code == 404
            cancelled = await http.delete(f"/v1/jobs/{other['id']}", headers=bearer(PRODUCER_A))
            assert cancelled.status_code == 404
        still = await http.get(f"/v1/jobs/{theirs['id']}", headers=bearer(PRODUCER_B))
        assert still.json()["state"] == "scheduled"

        def listed(token: str) -> set[str]:
            return {j["id"] for j in pages[token]}

        pages = {
            token: (await http.get("/v1/jobs", headers=bearer(token))).json()["jobs"]
            for token in (PRODUCER_A, PRODUCER_B, PRODUCER, ADMIN)
        }
        assert listed(PRODUCER_A) == {mine["id"]}
        assert listed(PRODUCER_B) == {theirs["id"]}
        assert listed(PRODUCER) == {default["id"]}  # the default namespace is a namespace too
        assert listed(ADMIN) == {mine["id"], theirs["id"], default["id"]}
        admin_view = await http.get(f"/v1/jobs/{theirs['id']}", headers=bearer(ADMIN))
        assert admin_view.json()["namespace"] == "team-b"
        own = await http.delete(f"/v1/jobs/{mine['id']}", headers=bearer(PRODUCER_A))
        assert own.json()["state"] == "cancelled"


async def test_idempotency_keys_do_not_leak_across_namespaces(node: Node) -> None:
    async with client(node) as http:
        theirs = await http.post(
            "/v1/jobs", json=job(payload="b", idempotency_key="k-1"), headers=bearer(PRODUCER_B)
        )
        mine = await http.post(
            "/v1/jobs", json=job(payload="a", idempotency_key="k-1"), headers=bearer(PRODUCER_A)
        )
        assert (theirs.status_code, mine.status_code) == (201, 201)
        assert mine.json()["id"] != theirs.json()["id"]
        assert mine.json()["payload"] == "a"
        batch = await http.post(
            "/v1/jobs/batch",
            json={"jobs": [job(idempotency_key="k-1"), job(idempotency_key="k-2")]},
            headers=bearer(PRODUCER_A),
        )
        assert [j["created"] for j in batch.json()["jobs"]] == [False, True]
        assert batch.json()["jobs"][0]["id"] == mine.json()["id"]
        again = await http.post(
            "/v1/jobs", json=job(idempotency_key="k-1"), headers=bearer(PRODUCER_B)
        )
        assert (again.status_code, again.json()["id"]) == (200, theirs.json()["id"])


async def test_routing_keys_outside_the_keys_prefixes_answer_403_and_store_nothing(
    node: Node,
) -> None:
    async with client(node) as http:
        for routing_key in ("billing.invoice", "audit:trail.x"):
            allowed = await http.post("/v1/jobs", json=job(routing_key), headers=bearer(PREFIXED))
            assert allowed.status_code == 201, allowed.text
        refused = await http.post("/v1/jobs", json=job("orders.expire"), headers=bearer(PREFIXED))
        assert refused.status_code == 403
        assert refused.json()["fields"][0]["field"] == "routing_key"
        assert "'billing.'" in refused.json()["message"]
        refused_batch = await http.post(
            "/v1/jobs/batch",
            json={"jobs": [job("billing.ok"), job("billingx.no")]},
            headers=bearer(PREFIXED),
        )
        assert refused_batch.status_code == 403
        assert refused_batch.json()["fields"][0]["field"] == "jobs[1].routing_key"
        stored = (await http.get("/v1/jobs", headers=bearer(ADMIN))).json()["jobs"]
    assert sorted(j["routing_key"] for j in stored) == ["audit:trail.x", "billing.invoice"]


async def test_a_stored_key_turns_auth_on_and_a_revoked_one_stops_working_in_time(
    keyless_node: Node,
) -> None:
    store = KeyStore(keyless_node.core.db)
    async with client(keyless_node) as http:
        assert (await http.get("/v1/jobs")).status_code == 200
        key, token = await store.create(scope=api_keys.Scope.PRODUCER, namespace="team-s")
        # Auth is on at once (test_key_notices), within the cache time at worst.
        assert await wait_for_status(http, 401, {}, 5) <= CACHE_S + 1.0
        created = await http.post("/v1/jobs", json=job(), headers=bearer(token))
        assert created.json()["namespace"] == "team-s"
        assert await store.revoke(key.id)
        assert await wait_for_status(http, 401, bearer(token), 5) <= CACHE_S + 1.0
        # Revoking the last key does not open the API again.
        await asyncio.sleep(CACHE_S * 2)
        assert (await http.get("/v1/jobs")).status_code == 401
    assert not await store.revoke(key.id)


async def dispatcher_cli(database_url: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "DISPATCHER_DATABASE_URL": database_url}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatcher",
        "keys",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_keys_command_creates_lists_and_revokes_stored_keys(
    keyless_node: Node, database_url: str
) -> None:
    code, out, err = await dispatcher_cli(
        database_url,
        "create",
        "--scope",
        "producer",
        "--namespace",
        "team-c",
        "--routing-key-prefix",
        "billing.",
        "--routing-key-prefix",
        "audit.",
        "--name",
        "ci",
    )
    assert code == 0, err
    token = out.strip()
    assert token.startswith(api_keys.TOKEN_PREFIX)
    assert "\n" not in token
    assert "created key 1" in err
    code, listing, _ = await dispatcher_cli(database_url, "list", "--json")
    assert code == 0
    [shown] = json.loads(listing)
    assert shown["scope"] == "producer"
    assert shown["namespace"] == "team-c"
    assert shown["routing_key_prefixes"] == ["billing.", "audit."]
    assert (shown["name"], shown["revoked_at"]) == ("ci", None)
    assert token not in listing
    assert api_keys.digest(token).hex() not in listing
    async with client(keyless_node) as http:
        await wait_for_status(http, 200, bearer(token), 5)
        refused = await http.post("/v1/jobs", json=job("orders.x"), headers=bearer(token))
        assert refused.status_code == 403
        code, out, _ = await dispatcher_cli(database_url, "revoke", str(shown["id"]))
        assert (code, out.strip()) == (0, f"revoked key {shown['id']}")
        await wait_for_status(http, 401, bearer(token), 5)
    code, _, err = await dispatcher_cli(database_url, "revoke", str(shown["id"]))
    assert code == 1
    assert "no live key" in err
    code, _, err = await dispatcher_cli(
        database_url, "create", "--scope", "admin", "--namespace", "x"
    )
    assert code == 2
    assert "only producer and limits keys" in err


async def test_keys_never_appear_in_logs_or_metrics(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _, stored = await KeyStore(node.core.db).create(scope=api_keys.Scope.PRODUCER, name="stored")
    tokens = [ADMIN, PRODUCER_A, MONITOR, stored]
    async with client(node) as http:
        assert (await http.post("/v1/jobs", json=job(), headers=bearer(ADMIN))).status_code == 201
        assert (await http.get("/v1/jobs", headers=bearer(PRODUCER_A))).status_code == 200
        assert (await http.get("/v1/jobs", headers=bearer(stored))).status_code == 200
        assert (await http.get("/v1/jobs", headers=bearer(ADMIN + "x"))).status_code == 401
        assert (await http.get("/v1/jobs", headers=bearer(stored[:-1]))).status_code == 401
        assert (await http.get("/metrics", headers=bearer(PRODUCER_A))).status_code == 403
        refused = await http.post("/v1/jobs", json=job(), headers=bearer(MONITOR))
        assert refused.status_code == 403
        metrics = (await http.get("/metrics", headers=bearer(MONITOR))).text
    assert "refused GET /v1/jobs (401)" in caplog.text  # the refusals were logged, without keys
    assert 'dispatcher_auth_refused_total{status="401"} 2.0' in metrics
    assert 'dispatcher_auth_refused_total{status="403"} 2.0' in metrics
    records = " ".join(repr(vars(record)) for record in caplog.records)
    for token in tokens:
        assert token not in caplog.text
        assert token not in records
        assert token not in metrics
        assert token[:-1] not in caplog.text + metrics  # nor the near-miss tokens
    assert stored[:12] not in caplog.text + metrics


async def test_the_sdk_client_sends_its_api_key(node: Node) -> None:
    transport = httpx.ASGITransport(app=node.serving.app)
    async with DispatcherClient("http://node", api_key=PRODUCER_A, transport=transport) as sdk:
        scheduled = await sdk.schedule("orders.expire", {"n": 1}, idempotency_key=str(uuid.uuid4()))
        assert scheduled.namespace == "team-a"
        assert (await sdk.get(scheduled.id)).id == scheduled.id
    async with DispatcherClient("http://node", transport=transport) as anonymous:
        with pytest.raises(AccessDenied) as missing:
            await anonymous.get(scheduled.id)
    assert missing.value.status == 401
    async with DispatcherClient("http://node", api_key=MONITOR, transport=transport) as monitor:
        with pytest.raises(AccessDenied) as scope:
            await monitor.schedule("orders.expire", 1)
    assert scope.value.status == 403


async def test_while_postgresql_is_unreachable_stored_keys_get_503_and_auth_stays_on(
    keyless_node: Node,
) -> None:
    _, token = await KeyStore(keyless_node.core.db).create(scope=api_keys.Scope.MONITOR)
    async with client(keyless_node) as http:
        await wait_for_status(http, 401, {}, 5)
        assert (await http.get("/metrics", headers=bearer(token))).status_code == 200
        await keyless_node.core.db.close()  # the store is unreachable from here on
        try:
            await asyncio.sleep(CACHE_S * 2)  # past the cache: the answers are stale now
            stale = await http.get("/metrics", headers=bearer(token))
            assert stale.status_code == 503  # a stale answer is not used: the key may be revoked
            assert (await http.get("/metrics")).status_code == 401
            unknown = await http.get("/metrics", headers=bearer(api_keys.new_token()))
            assert unknown.status_code == 503  # neither let in nor refused a key never seen
        finally:
            await keyless_node.core.db.open()


async def test_while_postgresql_is_unreachable_an_open_node_stays_open(
    keyless_node: Node,
) -> None:
    async with client(keyless_node) as http:
        assert (await http.get("/metrics")).status_code == 200  # no key: open
        await keyless_node.core.db.close()  # the store is unreachable from here on
        try:
            await asyncio.sleep(CACHE_S * 2)  # past the cache
            # No key can be created meanwhile: monitoring keeps answering through the outage.
            assert (await http.get("/metrics")).status_code == 200
        finally:
            await keyless_node.core.db.open()


async def test_keys_command_on_an_unmigrated_database_says_to_migrate(
    pg_server: PostgresServer,
) -> None:
    name = f"bare_{uuid.uuid4().hex}"
    pg_server.create_database(name)
    try:
        code, _, err = await dispatcher_cli(pg_server.dsn(name), "list")
    finally:
        pg_server.drop_database(name)
    assert code == 1
    assert "run 'dispatcher migrate' first" in err


async def test_a_key_limited_to_a_prefix_reaches_no_job_outside_it_and_changes_none(
    node: Node,
) -> None:
    """Probed: a key limited to ``billing.`` read, changed and cancelled a ``payments.`` job of
    its namespace. Outside its prefixes a job is not found (404), as in another namespace; the
    prefix ends at a dot (``billing.`` does not reach ``billingx.``)."""
    async with client(node) as http:
        ids = {}
        for routing_key in ("payments.capture", "billingx.refund", "billing.invoice"):
            made = await http.post(
                "/v1/jobs",
                json=job(routing_key, idempotency_key=routing_key),
                headers={**WRITE, **bearer(PRODUCER_A)},
            )
            assert made.status_code == 201, made.text
            ids[routing_key] = made.json()["id"]
        prefixed = {**WRITE, **bearer(PREFIXED)}
        for outside in ("payments.capture", "billingx.refund"):
            path = f"/v1/jobs/{ids[outside]}"
            answers = [
                await http.get(path, headers=prefixed),
                await http.patch(path, json={"payload": {"n": 2}}, headers=prefixed),
                await http.patch(path, json={"delay_ms": 1}, headers=prefixed),
                await http.delete(path, headers=prefixed),
            ]
            assert [answer.status_code for answer in answers] == [404] * 4, answers
            found = await http.get(f"/v1/jobs?idempotency_key={outside}", headers=prefixed)
            assert found.json()["jobs"] == []
            stored = (await http.get(path, headers=bearer(ADMIN))).json()
            assert (stored["state"], stored["payload"]) == ("scheduled", {"n": 1})
        listed = (await http.get("/v1/jobs", headers=prefixed)).json()["jobs"]
        assert [j["routing_key"] for j in listed] == ["billing.invoice"]
        own = f"/v1/jobs/{ids['billing.invoice']}"
        assert (await http.get(own, headers=prefixed)).status_code == 200
        assert (await http.delete(own, headers=prefixed)).json()["state"] == "cancelled"
