"""Two tenants on one node, probed as a hostile one would: namespaces ``a`` and ``b``, two
routing-key prefixes in ``a`` (``billing.``, ``payments.``), a default-namespace producer and an
admin. No key reaches a job, a bulk action or an idempotency key outside its namespace and
prefixes, and statements that lock several jobs never deadlock each other."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import asyncpg
import httpx
import pytest

from dispatcher.node import Node
from tests.support.nodes import bearer, client, running_node

ADMIN = "admin-token-0123456789"
BILLING = "billing-token-0123456789"
PAYMENTS = "payments-token-0123456789"
TEAM_B = "team-b-token-0123456789"
DEFAULT = "default-token-0123456789"
API_KEYS = ",".join(
    [
        f"{ADMIN}:admin",
        f"{BILLING}:producer:a:billing.",
        f"{PAYMENTS}:producer:a:payments.",
        f"{TEAM_B}:producer:b",
        f"{DEFAULT}:producer",
    ]
)


def job(routing_key: str, **fields: object) -> dict[str, object]:
    return {"routing_key": routing_key, "payload": {"n": 1}, "delay_ms": 600_000, **fields}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with _node(database_url, amqp_url) as running:
        yield running


@pytest.fixture
async def slow_bulk_node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    """Bulk actions worked a job every two seconds: one stopped at once stays stopped."""
    async with _node(database_url, amqp_url, bulk_batch=1, bulk_rate_per_s=0.5) as running:
        yield running


def _node(database_url: str, amqp_url: str, **more: object) -> AbstractAsyncContextManager[Node]:
    return running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="tenants",
        shard_count=4,
        api_keys=API_KEYS,
        **more,
    )


async def stored_count(http: httpx.AsyncClient) -> int:
    listed = await http.get("/v1/jobs", params={"limit": 1000}, headers=bearer(ADMIN))
    return len(listed.json()["jobs"])


async def test_an_idempotency_key_held_outside_the_keys_prefixes_answers_409_and_no_job(
    node: Node,
) -> None:
    """Probed: the ``billing.`` key submitting a key a ``payments.`` job holds got that job back,
    payload included (``keep``, and ``replace`` refused). It now answers 409 naming the field,
    shows no job, changes none, and a batch naming such a key stores nothing."""
    async with client(node) as http:
        theirs = await http.post(
            "/v1/jobs",
            json=job("payments.capture", payload={"card": "4242"}, idempotency_key="order-7"),
            headers=bearer(PAYMENTS),
        )
        assert theirs.status_code == 201, theirs.text
        before = await stored_count(http)
        for how in ("keep", "replace", "extend"):
            answer = await http.post(
                "/v1/jobs",
                json=job("billing.invoice", idempotency_key="order-7", on_existing=how),
                headers=bearer(BILLING),
            )
            assert answer.status_code == 409, (how, answer.text)
            assert answer.json()["fields"][0]["field"] == "idempotency_key"
            assert "4242" not in answer.text
            assert theirs.json()["id"] not in answer.text
        batch = await http.post(
            "/v1/jobs/batch",
            json={
                "jobs": [
                    job("billing.invoice", idempotency_key="fresh-1"),
                    job("billing.invoice", idempotency_key="order-7"),
                ]
            },
            headers=bearer(BILLING),
        )
        assert batch.status_code == 409, batch.text
        assert batch.json()["fields"][0]["field"] == "jobs[1].idempotency_key"
        assert "4242" not in batch.text
        assert await stored_count(http) == before  # fresh-1 went with the batch
        kept = await http.get(f"/v1/jobs/{theirs.json()['id']}", headers=bearer(PAYMENTS))
        assert kept.json()["payload"] == {"card": "4242"}
        # Its own key still answers as ever: the job stored earlier.
        again = await http.post(
            "/v1/jobs",
            json=job("payments.capture", idempotency_key="order-7"),
            headers=bearer(PAYMENTS),
        )
        assert (again.status_code, again.json()["id"]) == (200, theirs.json()["id"])


async def test_after_naming_a_job_outside_the_keys_prefixes_answers_as_a_random_id(
    node: Node,
) -> None:
    """Probed: ``after=`` took another prefix's job id (201), an oracle of which ids exist."""
    async with client(node) as http:
        theirs = await http.post("/v1/jobs", json=job("payments.capture"), headers=bearer(PAYMENTS))
        answers = {}
        for name, named in (("theirs", theirs.json()["id"]), ("random", str(uuid.uuid4()))):
            answer = await http.post(
                "/v1/jobs", json=job("billing.invoice", after=[named]), headers=bearer(BILLING)
            )
            answers[name] = (answer.status_code, answer.json()["message"].replace(named, "ID"))
        assert answers["theirs"] == answers["random"]
        assert answers["random"][0] == 422
        own = await http.post("/v1/jobs", json=job("billing.charge"), headers=bearer(BILLING))
        waits = await http.post(
            "/v1/jobs",
            json=job("billing.invoice", after=[own.json()["id"]]),
            headers=bearer(BILLING),
        )
        assert waits.status_code == 201, waits.text


async def make_action(http: httpx.AsyncClient, token: str, **filter_: object) -> str:
    made = await http.post(
        "/v1/bulk-actions",
        json={"action": "cancel", "filter": {"state": "scheduled", **filter_}},
        headers=bearer(token),
    )
    assert made.status_code == 202, made.text
    return str(made.json()["id"])


async def reach(http: httpx.AsyncClient, token: str, action_id: str) -> list[int]:
    """The answers of every route that names one action, for this key."""
    path = f"/v1/bulk-actions/{action_id}"
    listed = await http.get("/v1/bulk-actions", headers=bearer(token))
    return [
        200 if action_id in [a["id"] for a in listed.json()["bulk_actions"]] else 404,
        (await http.get(path, headers=bearer(token))).status_code,
        (await http.post(f"{path}/stop", headers=bearer(token))).status_code,
        (await http.post(f"{path}/resume", headers=bearer(token))).status_code,
    ]


async def test_bulk_actions_are_reached_only_within_the_keys_namespace_and_prefixes(
    slow_bulk_node: Node,
) -> None:
    """Probed: the ``billing.`` key listed, read and resumed a cancel the ``payments.`` key had
    stopped; a default-namespace key read and resumed an admin's action for every namespace."""
    async with client(slow_bulk_node) as http:
        for token, routing_key in ((PAYMENTS, "payments.capture"), (BILLING, "billing.invoice")):
            batch = {"jobs": [job(routing_key)] * 5}
            made = await http.post("/v1/jobs/batch", json=batch, headers=bearer(token))
            assert made.status_code == 201, made.text
        payments = await make_action(http, PAYMENTS)
        stopped = await http.post(f"/v1/bulk-actions/{payments}/stop", headers=bearer(PAYMENTS))
        everywhere = await make_action(http, ADMIN)
        await http.post(f"/v1/bulk-actions/{everywhere}/stop", headers=bearer(ADMIN))
        for_a = await make_action(http, ADMIN, namespace="a", routing_key_prefix="billing")
        await http.post(f"/v1/bulk-actions/{for_a}/stop", headers=bearer(ADMIN))

        assert await reach(http, BILLING, payments) == [404] * 4
        assert await reach(http, TEAM_B, payments) == [404] * 4
        assert await reach(http, DEFAULT, payments) == [404] * 4
        for token in (BILLING, PAYMENTS, TEAM_B, DEFAULT):
            assert await reach(http, token, everywhere) == [404] * 4, token
        # An admin's action on billing jobs of namespace a is the billing key's to follow.
        assert (await reach(http, BILLING, for_a))[:2] == [200, 200]
        assert (await reach(http, PAYMENTS, for_a))[:2] == [404, 404]
        # Nothing the refused calls asked for happened: the stopped action is still stopped.
        assert stopped.json()["status"] == "stopped"
        after = await http.get(f"/v1/bulk-actions/{payments}", headers=bearer(PAYMENTS))
        assert after.json()["status"] == "stopped"
        # The keys that made them still reach their own.
        assert (await reach(http, PAYMENTS, payments))[:2] == [200, 200]
        assert (await reach(http, ADMIN, everywhere))[:2] == [200, 200]


async def deadlocks(database_url: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        found = await connection.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await connection.close()
    return int(found)


async def test_batches_locking_the_same_jobs_in_opposite_orders_never_deadlock(
    node: Node, database_url: str
) -> None:
    """Keyed replace batches name their jobs in opposite orders while a bulk cancel's batches take
    the same jobs: every statement that locks several jobs takes them in id order, so they wait
    for each other in turn and PostgreSQL counts no deadlock."""
    keys = [f"k-{n:03d}" for n in range(60)]
    async with client(node) as http:
        first = await http.post(
            "/v1/jobs/batch",
            json={"jobs": [job("billing.invoice", idempotency_key=k) for k in keys]},
            headers=bearer(BILLING),
        )
        assert first.status_code == 201, first.text
        before = await deadlocks(database_url)

        async def replace(order: list[str], rounds: int) -> list[int]:
            answers = []
            for round_ in range(rounds):
                batch = [
                    job(
                        "billing.invoice",
                        payload={"r": round_},
                        idempotency_key=k,
                        on_existing="replace",
                    )
                    for k in order
                ]
                answer = await http.post(
                    "/v1/jobs/batch", json={"jobs": batch}, headers=bearer(BILLING)
                )
                answers.append(answer.status_code)
            return answers

        async def cancel_meanwhile() -> str:
            await asyncio.sleep(0.5)
            return await make_action(http, BILLING)

        *answers, cancel = await asyncio.gather(
            replace(keys, 15),
            replace(keys[::-1], 15),
            replace(keys[20:] + keys[:20], 15),
            cancel_meanwhile(),
        )
        await asyncio.sleep(1.5)  # the statistics are flushed at most once a second
        after = await deadlocks(database_url)
        action = await http.get(f"/v1/bulk-actions/{cancel}", headers=bearer(BILLING))
    assert [set(a) for a in answers] == [{200}] * 3
    assert after == before
    assert action.status_code == 200
