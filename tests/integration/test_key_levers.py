"""One pending job per idempotency key: a submit keeps, replaces or extends the pending job its key
names, and a job may let go of its key once dispatched or finished; on one in-process node through
real PostgreSQL and RabbitMQ."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from devstack.collector import Collector
from dispatcher.node import Node
from tests.support.nodes import client, jobs_stored, running_node
from tests.support.stored_events import STORED_EVENTS
from tests.support.waiting import job_when

NODE = {"node_id": "keys-test", "shard_count": 16}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(database_url=database_url, amqp_url=amqp_url, **NODE) as running:
        yield running


@pytest.fixture
async def collector(amqp_url: str) -> AsyncIterator[Collector]:
    consumer = Collector(amqp_url, binding="keys.#")
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


def later(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def job(key: str = "sync-42", **fields: Any) -> dict[str, Any]:
    return {"routing_key": "keys.sync", "payload": 1, "idempotency_key": key, **fields}


async def test_replace_gives_the_pending_job_the_new_time_payload_and_headers(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        first = await http.post("/v1/jobs", json=job(run_at=later(60), priority=1))
        second = await http.post(
            "/v1/jobs",
            json=job(run_at=later(1), payload={"v": 2}, headers={"h": "x"}, on_existing="replace"),
        )
        assert (first.status_code, second.status_code) == (201, 200), second.text
        assert second.json()["outcome"] == "replaced"
        assert second.json()["created"] is False
        assert second.json()["id"] == first.json()["id"]
        assert second.json()["payload"] == {"v": 2}
        assert second.json()["priority"] is None  # replaced as sent
        assert await collector.wait_for([first.json()["id"]], 15) == set()
        [delivery] = collector.deliveries[first.json()["id"]]
        assert orjson.loads(delivery.body) == {"v": 2}
        assert delivery.headers["h"] == "x"
        history = (await job_when(http, first.json()["id"], "dispatched"))["history"]
    events = [step["event"] for step in history]
    assert events == ["scheduled", "replaced", "dispatched"]
    assert history[1]["detail"].startswith("run_at ")
    assert history[1]["consumer"] == "keys-test"


async def test_extend_moves_the_job_later_never_earlier(node: Node) -> None:
    async with client(node) as http:
        first = (await http.post("/v1/jobs", json=job(run_at=later(60), payload="a"))).json()
        sooner = await http.post(
            "/v1/jobs", json=job(run_at=later(30), payload="b", on_existing="extend")
        )
        assert sooner.json()["outcome"] == "kept"
        assert sooner.json()["run_at"] == first["run_at"]
        moved = await http.post(
            "/v1/jobs", json=job(run_at=later(90), payload="c", on_existing="extend")
        )
        assert moved.json()["outcome"] == "extended"
        assert moved.json()["run_at"] > first["run_at"]
        assert moved.json()["payload"] == "a"  # extend moves the time only
        history = (await http.get(f"/v1/jobs/{first['id']}")).json()["history"]
    assert [step["event"] for step in history] == ["scheduled", "extended"]


async def test_a_job_being_dispatched_or_done_is_never_changed(
    node: Node, collector: Collector
) -> None:
    async with client(node) as http:
        first = (await http.post("/v1/jobs", json=job(payload="sent"))).json()
        assert await collector.wait_for([first["id"]], 15) == set()
        await job_when(http, first["id"], "dispatched")
        for how in ("replace", "extend"):
            answer = await http.post(
                "/v1/jobs", json=job(payload="late", run_at=later(60), on_existing=how)
            )
            assert answer.status_code == 200
            assert answer.json()["outcome"] == "refused"
            assert answer.json()["id"] == first["id"]
            assert answer.json()["payload"] == "sent"
        other_key = await http.post(  # another routing key is never changed either
            "/v1/jobs",
            json={**job("other", run_at=later(60)), "routing_key": "keys.a"},
        )
        refused = await http.post(
            "/v1/jobs",
            json={
                **job("other", run_at=later(30)),
                "routing_key": "keys.b",
                "on_existing": "extend",
            },
        )
    assert refused.json()["outcome"] == "refused"
    assert refused.json()["routing_key"] == "keys.a"
    assert refused.json()["run_at"] == other_key.json()["run_at"]


@pytest.mark.parametrize("release", ["dispatched", "finished"])
async def test_a_released_key_creates_a_new_job_once_its_job_is_done(
    node: Node, collector: Collector, release: str
) -> None:
    async with client(node) as http:
        first = (await http.post("/v1/jobs", json=job(release_key=release))).json()
        assert first["release_key"] == release
        assert await collector.wait_for([first["id"]], 15) == set()
        await job_when(http, first["id"], "dispatched")
        again = await http.post("/v1/jobs", json=job(release_key=release, run_at=later(60)))
        if release == "finished":  # dispatched is not finished: consumers report the outcome
            assert again.json()["outcome"] == "kept"
            assert again.json()["id"] == first["id"]
            return
        assert (again.status_code, again.json()["outcome"]) == (201, "created")
        assert again.json()["id"] != first["id"]
        # The new job holds the key; cancelled, it lets go (finished) and a third one is created.
        cancelled = await http.delete(f"/v1/jobs/{again.json()['id']}")
        assert cancelled.json()["key_released"] is True
        third = await http.post("/v1/jobs", json=job(run_at=later(60)))
        assert third.json()["outcome"] == "created"
        found = (await http.get("/v1/jobs", params={"idempotency_key": "sync-42"})).json()
    assert [j["id"] for j in found["jobs"]] == [
        third.json()["id"],
        again.json()["id"],
        first["id"],
    ]
    assert [j["key_released"] for j in found["jobs"]] == [False, True, True]
    assert {j["idempotency_key"] for j in found["jobs"]} == {"sync-42"}


async def test_a_finished_job_lets_go_of_its_key_when_cancelled(node: Node) -> None:
    async with client(node) as http:
        first = await http.post("/v1/jobs", json=job(release_key="finished", run_at=later(60)))
        await http.delete(f"/v1/jobs/{first.json()['id']}")
        again = await http.post("/v1/jobs", json=job(run_at=later(60)))
    assert again.json()["outcome"] == "created"


async def test_a_batch_mixes_keep_replace_extend_and_new_keys(node: Node) -> None:
    async with client(node) as http:
        for key in ("a", "b", "c"):
            await http.post("/v1/jobs", json=job(key, run_at=later(60), payload=key))
        batch = await http.post(
            "/v1/jobs/batch",
            json={
                "jobs": [
                    job("a", payload="a2", run_at=later(60)),
                    job("b", payload="b2", run_at=later(30), on_existing="replace"),
                    job("c", payload="c2", run_at=later(120), on_existing="extend"),
                    job("d", payload="d", run_at=later(60), on_existing="replace"),
                ]
            },
        )
    assert batch.status_code == 201, batch.text
    answers = batch.json()["jobs"]
    assert [a["outcome"] for a in answers] == ["kept", "replaced", "extended", "created"]
    assert [a["payload"] for a in answers] == ["a", "b2", "c", "d"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"on_existing": "replace"}, "on_existing"),
        ({"release_key": "dispatched"}, "release_key"),
        ({"idempotency_key": "k", "on_existing": "overwrite"}, "on_existing"),
        ({"idempotency_key": "k", "release_key": "later"}, "release_key"),
    ],
)
async def test_bad_key_levers_are_refused_naming_the_field(
    node: Node, database_url: str, fields: dict[str, str], field: str
) -> None:
    async with client(node) as http:
        answer = await http.post("/v1/jobs", json={"routing_key": "keys.x", "payload": 1, **fields})
        in_batch = await http.post(
            "/v1/jobs/batch", json={"jobs": [{"routing_key": "keys.x", "payload": 1, **fields}]}
        )
    assert answer.status_code == 422, answer.text
    assert [f["field"] for f in answer.json()["fields"]] == [field]
    assert in_batch.status_code == 422
    assert [f["field"] for f in in_batch.json()["fields"]] == [f"jobs[0].{field}"]
    assert await jobs_stored(database_url) == 0


async def test_the_contract_function_keeps_as_the_insert_does(database_url: str) -> None:
    """``dispatcher_enqueue_v2`` with every job kept (a second path) against v1 (the hot path):
    the same rows stored, the same job answered for a known key."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("INSERT INTO shard_epochs (shard, epoch) VALUES (0, 1)")
        v1 = await connection.fetch(
            "SELECT id FROM dispatcher_enqueue_v1(ARRAY[gen_random_uuid(), gen_random_uuid()],"
            " NULL, ARRAY[1, 2]::bigint[], ARRAY['a.b', 'a.b'], ARRAY['1', '2']::bytea[],"
            " ARRAY['{}', '{}']::jsonb[], ARRAY[NULL, NULL]::smallint[],"
            " ARRAY[NULL, NULL]::bigint[], ARRAY['k1', NULL], ARRAY[now(), now()],"
            " ARRAY[NULL, NULL]::text[], false)"
        )
        v2 = await connection.fetch(
            "SELECT ordinal, id, outcome FROM dispatcher_enqueue_v2("
            "ARRAY[gen_random_uuid(), gen_random_uuid()], NULL, ARRAY[1, 2]::bigint[],"
            " ARRAY['a.b', 'a.b'], ARRAY['3', '4']::bytea[], ARRAY['{}', '{}']::jsonb[],"
            " ARRAY[NULL, NULL]::smallint[], ARRAY[NULL, NULL]::bigint[], ARRAY['k1', 'k2'],"
            " ARRAY[now(), now()], ARRAY[NULL, NULL]::text[], NULL, NULL, false, 'test')"
        )
        payloads = await connection.fetch(
            "SELECT idempotency_key, payload FROM jobs ORDER BY payload"
        )
    finally:
        await connection.close()
    assert len(v1) == 2
    assert [(row["ordinal"], row["outcome"]) for row in v2] == [(1, "kept"), (2, "created")]
    assert v2[0]["id"] == v1[0]["id"]
    assert [(row["idempotency_key"], bytes(row["payload"])) for row in payloads] == [
        ("k1", b"1"),
        (None, b"2"),
        ("k2", b"4"),
    ]


# dispatcher_enqueue_v3 (sql/0024, every batch the node stores) called as v2 (sql/0019) is.
V2_OR_V3 = (
    "SELECT ordinal, id, created_at, outcome FROM dispatcher_enqueue_{}($1::uuid[], NULL, "
    "$2::bigint[], $3::text[], $4::bytea[], $5::jsonb[], $6::smallint[], $7::bigint[], "
    "$8::text[], $9::timestamptz[], $10::text[], $11::text[], $12::text[], false, 'test')"
)
# The jobs stored before each batch: (key, state, key_release, run_at in s from now).
STANDING = [
    ("keep-me", "scheduled", None, 60),
    ("replace-me", "scheduled", None, 60),
    ("extend-me", "scheduled", None, 60),
    ("not-earlier", "scheduled", None, 60),
    ("sent", "dispatched", None, 60),
    ("let-go", "succeeded", "finished", -60),
]
# A batch of every case: (key, on_existing, key_release, run_at in s from now, routing key).
MIXED = [
    (None, None, None, 30, "a.b"),
    ("fresh", None, None, 30, "a.b"),
    ("fresh", None, None, 40, "a.b"),  # the same new key twice in one batch
    ("keep-me", "keep", None, 30, "a.b"),
    ("replace-me", "replace", None, 30, "a.b"),
    ("extend-me", "extend", None, 90, "a.b"),
    ("not-earlier", "extend", None, 30, "a.b"),
    ("sent", "replace", None, 30, "a.b"),
    ("keep-me", "replace", None, 30, "other.key"),  # another routing key's job: refused
    ("let-go", "keep", "finished", 30, "a.b"),  # its job let go of the key: a new one
    ("fresh-2", "replace", "finished", 30, "a.b"),
]


async def test_the_set_based_contract_function_answers_as_v2_did(database_url: str) -> None:
    """``dispatcher_enqueue_v3`` (a second implementation of v2's contract, set-based), for a
    batch of every case: the outcome for each job, the job answering it (the submitted one or the
    one its key names), and the rows stored, history included, as v2's own body (0021) gave them
    until v2 became a call of v3 (0025); v2 now answers the same through v3."""
    connection = await asyncpg.connect(database_url)

    async def run(version: str) -> tuple[list[tuple[int, str, str]], list[tuple[object, ...]]]:
        transaction = connection.transaction()
        await transaction.start()
        try:
            now = datetime.now(UTC)
            standing: dict[str, Any] = {}
            for key, state, release, due_s in STANDING:
                standing[key] = await connection.fetchval(
                    "INSERT INTO jobs (id, shard, routing_key, payload, headers, run_at,"
                    " idempotency_key, state, key_release) VALUES (gen_random_uuid(), 0, 'a.b',"
                    " 'old', '{}', $1, $2, $3, $4) RETURNING id",
                    now + timedelta(seconds=due_s),
                    key,
                    state,
                    release,
                )
            await connection.execute(
                "UPDATE jobs SET idempotency_key = NULL, released_key = 'let-go'"
                " WHERE idempotency_key = 'let-go'"
            )
            submitted = [
                await connection.fetchval("SELECT gen_random_uuid()") for _ in range(len(MIXED))
            ]
            rows = await connection.fetch(
                V2_OR_V3.format(version),
                submitted,
                list(range(len(MIXED))),
                [routing_key for *_, routing_key in MIXED],
                [f"new-{n}".encode() for n in range(len(MIXED))],
                ["{}"] * len(MIXED),
                [None] * len(MIXED),
                [None] * len(MIXED),
                [key for key, *_ in MIXED],
                [now + timedelta(seconds=due_s) for *_, due_s, _ in MIXED],
                [None] * len(MIXED),
                [release for _, _, release, *_ in MIXED],
                [how for _, how, *_ in MIXED],
            )
            names = {job_id: f"submitted {n}" for n, job_id in enumerate(submitted)}
            names.update({job_id: f"standing {key}" for key, job_id in standing.items()})
            answers = [(row["ordinal"], names[row["id"]], row["outcome"]) for row in rows]
            stored = [
                (
                    names[row["id"]],
                    row["idempotency_key"],
                    bytes(row["payload"]),
                    round((row["run_at"] - now).total_seconds()),
                    row["events"],
                )
                for row in await connection.fetch(
                    # a change's detail names the new run_at, compared as the row's own above
                    "SELECT j.*, (SELECT array_agg(job_events.outcome || ' '"
                    " || split_part(job_events.detail, ' ', 1) ORDER BY job_events.at)"
                    f" FROM {STORED_EVENTS} WHERE job_events.job_id = j.id) AS events FROM jobs j"
                )
            ]
            return answers, sorted(stored, key=str)
        finally:
            await transaction.rollback()

    try:
        await connection.execute("INSERT INTO shard_epochs (shard, epoch) VALUES (0, 1)")
        v2, v3 = await run("v2"), await run("v3")
    finally:
        await connection.close()
    assert [outcome for *_, outcome in v2[0]] == [
        "created",
        "created",
        "kept",
        "kept",
        "replaced",
        "extended",
        "kept",
        "refused",
        "refused",
        "created",
        "created",
    ]
    assert v3[1] == [
        ("standing extend-me", "extend-me", b"old", 90, ["extended run_at"]),
        ("standing keep-me", "keep-me", b"old", 60, None),
        ("standing let-go", None, b"old", -60, None),
        ("standing not-earlier", "not-earlier", b"old", 60, None),
        ("standing replace-me", "replace-me", b"new-4", 30, ["replaced run_at"]),
        ("standing sent", "sent", b"old", 60, None),
        ("submitted 0", None, b"new-0", 30, None),
        ("submitted 1", "fresh", b"new-1", 30, None),
        ("submitted 10", "fresh-2", b"new-10", 30, None),
        ("submitted 9", "let-go", b"new-9", 30, None),
    ]
    assert v3 == v2
