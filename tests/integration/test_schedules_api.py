"""/v1/schedules against an in-process node and a real PostgreSQL: validation naming the field,
409 on a taken name, pause and resume, delete, namespaces and routing-key prefixes, and the
materialiser turning occurrences into jobs once."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio

from dispatcher.node import Node
from tests.support.nodes import ON_THE_MODULES_NODE, client, running_node
from tests.support.waiting import until

ADMIN = "admin-token-0123456789"
TEAM_A = "producer-a-token-0123456789"
TEAM_B = "producer-b-token-0123456789"
PREFIXED = "producer-prefixed-token-012"
MONITOR = "monitor-token-0123456789"
API_KEYS = ",".join(
    [
        f"{ADMIN}:admin",
        f"{TEAM_A}:producer:team-a",
        f"{TEAM_B}:producer:team-b",
        f"{PREFIXED}:producer:team-a:billing.",
        f"{MONITOR}:monitor",
    ]
)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def schedule(name: str = "nightly", **fields: object) -> dict[str, object]:
    body: dict[str, object] = {
        "name": name,
        "cron": "0 3 * * *",
        "timezone": "Asia/Shanghai",
        "job": {"routing_key": "billing.report", "payload": {"kind": "nightly"}},
    }
    body.update(fields)
    return body


NODE = {
    "node_id": "schedules",
    "shard_count": 8,
    "api_keys": API_KEYS,
    "api_key_cache_s": 0.2,
    "schedule_poll_s": 0.2,
    "schedule_ahead_s": 5,
    "schedule_catchup_window_s": 30,
    "max_schedules_per_namespace": 3,
    "schedule_min_interval_s": 1,  # every second: occurrences within a test's time
}


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(database_url=database_url, amqp_url=amqp_url, **NODE) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def refusing_node(module_database_url: str, module_amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=module_database_url, amqp_url=module_amqp_url, **NODE
    ) as running:
        yield running


async def count_rows(database_url: str, table: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        return int(await connection.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await connection.close()


async def test_create_and_get_shows_the_next_occurrences_in_the_zone(node: Node) -> None:
    async with client(node) as http:
        created = await http.post("/v1/schedules", json=schedule(), headers=bearer(TEAM_A))
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["namespace"] == "team-a"
        assert body["missed"] == "latest"
        assert body["job"]["payload"] == {"kind": "nightly"}
        got = (await http.get("/v1/schedules/nightly", headers=bearer(TEAM_A))).json()
    upcoming = [datetime.fromisoformat(at) for at in got["upcoming"]]
    assert len(upcoming) == 5
    # 03:00 in Shanghai is 19:00 UTC the day before, every day.
    assert all(at.hour == 19 and at.minute == 0 for at in upcoming)
    assert all(b - a == timedelta(days=1) for a, b in itertools.pairwise(upcoming))
    assert datetime.fromisoformat(got["next_at"]) == upcoming[0]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"timezone": "../../etc/passwd"}, "timezone"),
        ({"cron": None, "interval_s": 0}, "interval_s"),
        ({"cron": None}, "cron"),
        ({"interval_s": 10}, "interval_s"),
        ({"name": "has space"}, "name"),
        ({"name": ""}, "name"),
        ({"missed": "some"}, "missed"),
        ({"grace_s": -1}, "grace_s"),
        ({"start_at": "2026-01-02T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"}, "end_at"),
        ({"start_at": "2026-01-02T00:00:00"}, "start_at"),
        # Outside 0001-01-02 to 9999-12-30 in UTC: what every zone, the search and PostgreSQL
        # carry (the first one was stored as -infinity, and the node stopped materialising it).
        ({"start_at": "0001-01-01T00:00:00Z", "interval_s": 1, "cron": None}, "start_at"),
        ({"start_at": "0001-01-01T23:59:59.999999Z"}, "start_at"),
        ({"start_at": "0001-01-02T00:00:00+00:01"}, "start_at"),
        ({"start_at": "9999-12-31T00:00:00-01:00"}, "start_at"),
        ({"end_at": "9999-12-31T23:59:59.999999Z"}, "end_at"),
        ({"end_at": "9999-12-30T00:00:00.000001Z"}, "end_at"),
        ({"timezone": "localtime"}, "timezone"),
        ({"timezone": "zone.tab"}, "timezone"),
        ({"job": {"routing_key": "billing.#", "payload": 1}}, "job.routing_key"),
        ({"job": {"routing_key": "billing.x", "payload": 1, "priority": 10}}, "job.priority"),
        ({"job": {"routing_key": "billing.x", "payload": 1, "ttl_ms": 0}}, "job.ttl_ms"),
        ({"job": {"routing_key": "billing.x", "payload": 1, "delay_ms": 5}}, "job.delay_ms"),
        (
            {"job": {"routing_key": "billing.x", "payload": 1, "headers": {"x-job-id": 1}}},
            "job.headers.x-job-id",
        ),
        (
            {"job": {"routing_key": "billing.x", "payload": 1, "headers": {"a": "\x00"}}},
            "job.headers.a",
        ),
        ({"job": {"routing_key": "billing.x"}}, "job.payload"),
    ],
)
@ON_THE_MODULES_NODE
async def test_invalid_schedule_answers_422_naming_the_field_and_stores_nothing(
    refusing_node: Node, module_database_url: str, fields: dict[str, object], field: str
) -> None:
    async with client(refusing_node) as http:
        response = await http.post("/v1/schedules", json=schedule(**fields), headers=bearer(TEAM_A))
    assert response.status_code == 422, response.text
    assert field in [item["field"] for item in response.json()["fields"]], response.text
    assert await count_rows(module_database_url, "schedules") == 0


async def test_a_taken_name_answers_409_within_a_namespace_only(node: Node) -> None:
    async with client(node) as http:
        assert (
            await http.post("/v1/schedules", json=schedule(), headers=bearer(TEAM_A))
        ).status_code == 201
        again = await http.post("/v1/schedules", json=schedule(), headers=bearer(TEAM_A))
        assert again.status_code == 409
        assert again.json()["fields"][0]["field"] == "name"
        other = await http.post("/v1/schedules", json=schedule(), headers=bearer(TEAM_B))
        assert other.status_code == 201


async def test_namespaces_see_only_their_own_schedules(node: Node) -> None:
    async with client(node) as http:
        await http.post("/v1/schedules", json=schedule("a-only"), headers=bearer(TEAM_A))
        await http.post("/v1/schedules", json=schedule("b-only"), headers=bearer(TEAM_B))
        listed = (await http.get("/v1/schedules", headers=bearer(TEAM_A))).json()
        assert [s["name"] for s in listed["schedules"]] == ["a-only"]
        everyone = (await http.get("/v1/schedules", headers=bearer(ADMIN))).json()
        assert {s["name"] for s in everyone["schedules"]} == {"a-only", "b-only"}
        for method in ("GET", "DELETE"):
            answer = await http.request(method, "/v1/schedules/b-only", headers=bearer(TEAM_A))
            assert answer.status_code == 404
        patched = await http.patch(
            "/v1/schedules/b-only", json={"paused": True}, headers=bearer(TEAM_A)
        )
        assert patched.status_code == 404
        assert (await http.get("/v1/schedules", headers=bearer(MONITOR))).status_code == 403
        assert (await http.get("/v1/schedules")).status_code == 401


async def test_routing_key_prefix_of_the_key_is_checked_naming_the_field(node: Node) -> None:
    async with client(node) as http:
        refused = await http.post(
            "/v1/schedules",
            json=schedule(job={"routing_key": "orders.x", "payload": 1}),
            headers=bearer(PREFIXED),
        )
        assert refused.status_code == 403
        assert refused.json()["fields"][0]["field"] == "job.routing_key"
        assert (
            await http.post("/v1/schedules", json=schedule(), headers=bearer(PREFIXED))
        ).status_code == 201
        patched = await http.patch(
            "/v1/schedules/nightly",
            json={"job": {"routing_key": "orders.x", "payload": 1}},
            headers=bearer(PREFIXED),
        )
        assert patched.status_code == 403
        assert patched.json()["fields"][0]["field"] == "job.routing_key"


async def test_unknown_schedule_is_404(node: Node) -> None:
    async with client(node) as http:
        for method in ("GET", "DELETE"):
            answer = await http.request(method, "/v1/schedules/nope", headers=bearer(ADMIN))
            assert answer.status_code == 404, answer.text
        patched = await http.patch(
            "/v1/schedules/nope", json={"paused": True}, headers=bearer(ADMIN)
        )
        assert patched.status_code == 404


async def test_patch_changes_timing_policy_and_template(node: Node) -> None:
    async with client(node) as http:
        await http.post("/v1/schedules", json=schedule(), headers=bearer(TEAM_A))
        changed = await http.patch(
            "/v1/schedules/nightly",
            json={
                "interval_s": 3600,
                "missed": "all",
                "end_at": "2099-01-01T00:00:00Z",
                "job": {"routing_key": "billing.hourly", "payload": [1], "priority": 3},
            },
            headers=bearer(TEAM_A),
        )
        assert changed.status_code == 200, changed.text
        body = changed.json()
        assert body["cron"] is None  # switched to the interval
        assert body["interval_s"] == 3600
        assert body["missed"] == "all"
        assert body["job"] == {
            "routing_key": "billing.hourly",
            "payload": [1],
            "headers": {},
            "priority": 3,
            "ttl_ms": None,
        }
        bad = await http.patch(
            "/v1/schedules/nightly", json={"cron": "0 0 31 2 *"}, headers=bearer(TEAM_A)
        )
        assert bad.status_code == 422
        assert bad.json()["fields"][0]["field"] == "cron"
        bad_zone = await http.patch(
            "/v1/schedules/nightly", json={"timezone": "Nowhere/City"}, headers=bearer(TEAM_A)
        )
        assert bad_zone.json()["fields"][0]["field"] == "timezone"
        both_gone = await http.patch(
            "/v1/schedules/nightly", json={"interval_s": None}, headers=bearer(TEAM_A)
        )
        assert both_gone.status_code == 422
        assert both_gone.json()["fields"][0]["field"] == "cron"
        unchanged = (await http.get("/v1/schedules/nightly", headers=bearer(TEAM_A))).json()
        assert unchanged["interval_s"] == 3600


async def jobs_of(database_url: str, name: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(
            "SELECT * FROM jobs WHERE idempotency_key LIKE $1 ORDER BY run_at", f"schedule:{name}:%"
        )
    finally:
        await connection.close()


async def has_jobs(database_url: str, name: str, count: int = 1) -> bool:
    return len(await jobs_of(database_url, name)) >= count


async def test_occurrences_become_jobs_once_and_pause_stops_them(
    node: Node, database_url: str
) -> None:
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    async with client(node) as http:
        created = await http.post(
            "/v1/schedules",
            json=schedule(
                "every-second",
                cron=None,
                interval_s=1,
                start_at=start.isoformat(),
                end_at=(start + timedelta(seconds=3)).isoformat(),
                job={"routing_key": "billing.tick", "payload": {"n": 1}, "headers": {"h": "v"}},
            ),
            headers=bearer(TEAM_A),
        )
        assert created.status_code == 201, created.text
        await until(lambda: has_jobs(database_url, "every-second", 4), 20)

        async def ended() -> bool:
            got = await http.get("/v1/schedules/every-second", headers=bearer(TEAM_A))
            return got.json()["next_at"] is None

        await until(ended)
        await asyncio.sleep(1)  # further passes add nothing
    rows = await jobs_of(database_url, "every-second")
    assert [row["run_at"] for row in rows] == [start + timedelta(seconds=i) for i in range(4)]
    assert rows[0]["idempotency_key"] == (
        f"schedule:every-second:{start.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    )
    assert all(row["namespace"] == "team-a" for row in rows)
    assert all(row["routing_key"] == "billing.tick" for row in rows)


async def test_pause_then_resume_skips_the_paused_time(node: Node, database_url: str) -> None:
    async with client(node) as http:
        await http.post(
            "/v1/schedules",
            json=schedule("ticker", cron=None, interval_s=1, paused=True),
            headers=bearer(TEAM_A),
        )
        got = (await http.get("/v1/schedules/ticker", headers=bearer(TEAM_A))).json()
        assert got["paused"] is True
        assert got["upcoming"] == []
        await asyncio.sleep(1.5)
        assert await jobs_of(database_url, "ticker") == []  # paused: nothing made
        resumed = await http.patch(
            "/v1/schedules/ticker", json={"paused": False}, headers=bearer(TEAM_A)
        )
        resumed_at = datetime.now(UTC)
        assert resumed.status_code == 200
        await until(lambda: has_jobs(database_url, "ticker"))
        paused = await http.patch(
            "/v1/schedules/ticker", json={"paused": True}, headers=bearer(TEAM_A)
        )
        assert paused.json()["paused"] is True
        made = len(await jobs_of(database_url, "ticker"))
        await asyncio.sleep(1.5)
        rows = await jobs_of(database_url, "ticker")
        assert len(rows) == made  # paused again: no more
        # Occurrences of the paused time were not made up for.
        assert rows[0]["run_at"] >= resumed_at - timedelta(seconds=1)


async def test_delete_removes_the_schedule_and_keeps_its_jobs(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        await http.post(
            "/v1/schedules",
            json=schedule("short", cron=None, interval_s=1),
            headers=bearer(TEAM_A),
        )
        await until(lambda: has_jobs(database_url, "short"))
        deleted = await http.delete("/v1/schedules/short", headers=bearer(TEAM_A))
        assert deleted.status_code == 200
        assert deleted.json()["name"] == "short"
        assert (await http.get("/v1/schedules/short", headers=bearer(TEAM_A))).status_code == 404
        made = len(await jobs_of(database_url, "short"))
        await asyncio.sleep(1)
    assert len(await jobs_of(database_url, "short")) == made
    assert await count_rows(database_url, "schedules") == 0


async def test_a_start_at_the_first_accepted_instant_under_missed_all_is_caught_up_boundedly(
    node: Node, database_url: str
) -> None:
    """The crash of issue 15: a schedule from year 1, every second, missing nothing. It is
    accepted from 0001-01-02 on, and its catch-up is the last DISPATCHER_SCHEDULE_CATCHUP_WINDOW_S
    (30 s here), not two thousand years of seconds."""
    body = schedule(
        "since-year-one",
        cron=None,
        interval_s=1,
        start_at="0001-01-02T00:00:00Z",
        end_at="9999-12-30T00:00:00Z",
        missed="all",
    )
    async with client(node) as http:
        created = await http.post("/v1/schedules", json=body, headers=bearer(TEAM_A))
        assert created.status_code == 201, created.text
        assert created.json()["error"] is None
        await until(lambda: has_jobs(database_url, "since-year-one", 30))
        got = (await http.get("/v1/schedules/since-year-one", headers=bearer(TEAM_A))).json()
    assert got["error"] is None
    assert got["paused"] is False
    assert len(got["upcoming"]) == 5
    made = [row["run_at"] for row in await jobs_of(database_url, "since-year-one")]
    assert made[0] >= datetime.now(UTC) - timedelta(seconds=60)
    assert len(made) < 60  # 30 s made up, 5 s ahead, a few seconds of passes


async def test_a_namespace_holds_at_most_the_configured_number_of_schedules(node: Node) -> None:
    async with client(node) as http:
        for index in range(3):
            answer = await http.post(
                "/v1/schedules", json=schedule(f"s{index}"), headers=bearer(TEAM_A)
            )
            assert answer.status_code == 201, answer.text
        refused = await http.post("/v1/schedules", json=schedule("s3"), headers=bearer(TEAM_A))
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "limit_reached"
        assert refused.json()["fields"][0]["field"] == "name"
        other = await http.post("/v1/schedules", json=schedule("s3"), headers=bearer(TEAM_B))
        assert other.status_code == 201  # per namespace
        await http.delete("/v1/schedules/s0", headers=bearer(TEAM_A))
        again = await http.post("/v1/schedules", json=schedule("s3"), headers=bearer(TEAM_A))
        assert again.status_code == 201


async def test_concurrent_creations_do_not_pass_the_limit(node: Node, database_url: str) -> None:
    async with client(node) as http:
        answers = await asyncio.gather(
            *(
                http.post("/v1/schedules", json=schedule(f"c{index}"), headers=bearer(TEAM_A))
                for index in range(8)
            )
        )
    assert sorted(answer.status_code for answer in answers) == [201] * 3 + [409] * 5
    assert await count_rows(database_url, "schedules") == 3


async def forget_zone(database_url: str, name: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "UPDATE schedules SET timezone = 'Gone/Zone', next_at = now() WHERE name = $1", name
        )
    finally:
        await connection.close()


async def test_a_parked_schedule_shows_why_and_a_resume_clears_it(
    node: Node, database_url: str
) -> None:
    async with client(node) as http:
        await http.post(
            "/v1/schedules",
            json=schedule("zone-gone", cron="* * * * *", timezone="Europe/Berlin"),
            headers=bearer(TEAM_A),
        )
        # As if the tz database of this node no longer knew its zone.
        await forget_zone(database_url, "zone-gone")

        async def parked() -> bool:
            got = await http.get("/v1/schedules/zone-gone", headers=bearer(TEAM_A))
            return bool(got.json()["error"])

        await until(parked)
        got = (await http.get("/v1/schedules/zone-gone", headers=bearer(TEAM_A))).json()
        assert got["paused"] is True
        assert "ZoneInfoNotFoundError" in got["error"]
        resumed = await http.patch(
            "/v1/schedules/zone-gone",
            json={"paused": False, "timezone": "Europe/Paris"},
            headers=bearer(TEAM_A),
        )
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["error"] is None
        assert resumed.json()["paused"] is False
        # Resuming without a zone it knows is refused, naming the field.
        await http.patch("/v1/schedules/zone-gone", json={"paused": True}, headers=bearer(TEAM_A))
        await forget_zone(database_url, "zone-gone")
        refused = await http.patch(
            "/v1/schedules/zone-gone", json={"paused": False}, headers=bearer(TEAM_A)
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["fields"][0]["field"] == "timezone"


async def test_a_key_limited_to_a_prefix_reaches_no_schedule_outside_it(node: Node) -> None:
    """Probed: a key limited to ``billing.`` paused, retimed and deleted a ``payments.``
    schedule of its namespace. Outside its prefixes a schedule is not found (404)."""
    theirs = schedule("payments-run", job={"routing_key": "payments.run", "payload": 1})
    async with client(node) as http:
        assert (
            await http.post("/v1/schedules", json=theirs, headers=bearer(TEAM_A))
        ).status_code == 201
        assert (
            await http.post("/v1/schedules", json=schedule(), headers=bearer(PREFIXED))
        ).status_code == 201
        path = "/v1/schedules/payments-run"
        answers = [
            await http.get(path, headers=bearer(PREFIXED)),
            await http.patch(path, json={"paused": True}, headers=bearer(PREFIXED)),
            await http.patch(path, json={"cron": "0 4 * * *"}, headers=bearer(PREFIXED)),
            await http.delete(path, headers=bearer(PREFIXED)),
        ]
        assert [answer.status_code for answer in answers] == [404] * 4, answers
        listed = (await http.get("/v1/schedules", headers=bearer(PREFIXED))).json()["schedules"]
        stored = (await http.get(path, headers=bearer(TEAM_A))).json()
    assert [s["name"] for s in listed] == ["nightly"]
    assert (stored["paused"], stored["cron"]) == (False, "0 3 * * *")


async def test_a_producer_cannot_take_the_key_of_a_schedules_occurrence(
    node: Node, database_url: str
) -> None:
    """Probed: a job stored first under ``schedule:<name>:<time>`` had that occurrence dropped
    as its duplicate. The prefix is reserved (422 naming the field); nothing is stored."""
    key = "schedule:nightly:2026-01-01T03:00:00Z"
    one = {"routing_key": "billing.report", "payload": 1, "idempotency_key": key}
    async with client(node) as http:
        single = await http.post("/v1/jobs", json=one, headers=bearer(TEAM_A))
        batch = await http.post("/v1/jobs/batch", json={"jobs": [one]}, headers=bearer(TEAM_A))
    assert single.status_code == 422, single.text
    assert [f["field"] for f in single.json()["fields"]] == ["idempotency_key"]
    assert batch.status_code == 422, batch.text
    assert [f["field"] for f in batch.json()["fields"]] == ["jobs[0].idempotency_key"]
    assert await count_rows(database_url, "jobs") == 0


@pytest.fixture
async def floored_node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    """The default floor on intervals (a minute), and a quota of three jobs a minute."""
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="floored",
        shard_count=8,
        api_keys=API_KEYS,
        max_schedule_jobs_per_minute=3,
    ) as running:
        yield running


async def test_an_interval_under_the_floor_is_refused_naming_it(
    floored_node: Node, database_url: str
) -> None:
    async with client(floored_node) as http:
        short = await http.post(
            "/v1/schedules", json=schedule("s", cron=None, interval_s=59), headers=bearer(TEAM_A)
        )
        minute = await http.post(
            "/v1/schedules", json=schedule("m", cron=None, interval_s=60), headers=bearer(TEAM_A)
        )
        retimed = await http.patch(
            "/v1/schedules/m", json={"interval_s": 1}, headers=bearer(TEAM_A)
        )
    assert short.status_code == 422, short.text
    assert [f["field"] for f in short.json()["fields"]] == ["interval_s"]
    assert "at least 60" in short.json()["message"]
    assert minute.status_code == 201, minute.text
    assert retimed.status_code == 422, retimed.text
    assert [f["field"] for f in retimed.json()["fields"]] == ["interval_s"]
    assert await count_rows(database_url, "schedules") == 1


async def test_a_namespaces_schedules_make_at_most_its_quota_of_jobs(floored_node: Node) -> None:
    def every_minute(name: str, **fields: object) -> dict[str, object]:
        return schedule(name, cron=None, interval_s=60, **fields)

    async with client(floored_node) as http:

        async def post(body: dict[str, object], token: str = TEAM_A) -> int:
            return (await http.post("/v1/schedules", json=body, headers=bearer(token))).status_code

        assert [await post(every_minute(f"m{index}")) for index in range(3)] == [201] * 3
        over = await http.post("/v1/schedules", json=every_minute("m3"), headers=bearer(TEAM_A))
        assert over.status_code == 409, over.text
        assert over.json()["error"] == "quota_reached"
        assert [f["field"] for f in over.json()["fields"]] == ["interval_s"]
        # Six an hour, at most one of them a minute, is over a quota already full.
        cron = schedule("c", cron="*/10 * * * *")
        assert await post(cron) == 409
        assert await post(every_minute("m3"), TEAM_B) == 201  # per namespace
        assert await post(every_minute("held", paused=True)) == 201  # a paused one makes none
        resumed = await http.patch(
            "/v1/schedules/held", json={"paused": False}, headers=bearer(TEAM_A)
        )
        assert resumed.status_code == 409, resumed.text
        slower = await http.patch(
            "/v1/schedules/m0", json={"interval_s": 120}, headers=bearer(TEAM_A)
        )
        assert slower.status_code == 200, slower.text  # half a job a minute freed
        assert await post(every_minute("m4")) == 409  # 2.5 + 1 > 3
        assert await post(schedule("hourly", cron="0 * * * *")) == 201  # 2.5 + 1/60


async def test_a_stored_cron_this_node_cannot_read_counts_as_busiest_not_as_an_error(
    floored_node: Node, database_url: str
) -> None:
    async with client(floored_node) as http:
        made = await http.post("/v1/schedules", json=schedule("old"), headers=bearer(TEAM_A))
        assert made.status_code == 201, made.text
        connection = await asyncpg.connect(database_url)
        try:  # as an older node might have accepted it
            await connection.execute("UPDATE schedules SET cron = 'bogus' WHERE name = 'old'")
        finally:
            await connection.close()
        body = schedule("m", cron=None, interval_s=60)
        answers = [
            await http.post("/v1/schedules", json={**body, "name": name}, headers=bearer(TEAM_A))
            for name in ("m1", "m2", "m3")
        ]
    # The unreadable one counts a job a minute (every minute of an hour): two more fit, not three.
    assert [answer.status_code for answer in answers] == [201, 201, 409], answers[-1].text
