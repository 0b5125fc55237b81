"""Property-based test (hypothesis) of recurring schedules through the pipeline of an in-process
node against real PostgreSQL and RabbitMQ: schedules drawn over each field's accepted range and
just past it, extremes first, are created through the API and materialised. Each is refused with a
4xx naming a field (storing nothing), or its occurrences become jobs (within its start and end and
the catch-up window) that reach their end, or it has legitimately nothing due yet or ended. No
schedule is parked, no pass raises, and the node's materialiser is still running at the end."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dispatcher.api.schedule_schemas import MAX_GRACE_S, MAX_INTERVAL_S
from dispatcher.node import Node
from dispatcher.recurring.occurrences import MAX_TIME, MIN_TIME
from tests.support.nodes import running_node
from tests.support.probe import Probe, assert_answer
from tests.support.waiting import until

AHEAD_S = 2.0
CATCHUP_S = 30.0
TICK = timedelta(microseconds=1)
NOW = datetime.now(UTC)

# Zones with DST (both hemispheres, a half-hour one), the widest offsets, a skipped day (Apia,
# 2011), odd offsets, and names that are not zones.
ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Pacific/Kiritimati",
    "Etc/GMT+12",
    "Asia/Kathmandu",
    "America/St_Johns",
    "Antarctica/Troll",
    "localtime",
    "Mars/Olympus",
]
CRON_FIELDS = [
    ["*", "0", "59", "*/7", "0-59/30", "5,10", "60"],
    ["*", "0", "23", "2", "1-3", "*/5"],
    ["*", "1", "31", "29", "15-20", "0"],
    ["*", "1", "2", "12", "feb", "jan-mar", "13"],
    ["*", "0", "7", "mon-fri", "sat", "8"],
]
crons = st.one_of(
    st.sampled_from(["* * * * *", "@yearly", "@hourly", "0 0 29 2 *", "0 0 31 2 *", "* * *"]),
    st.tuples(*(st.sampled_from(field) for field in CRON_FIELDS)).map(" ".join),
)
intervals = st.one_of(
    st.sampled_from([1, 2, 60, 86400, MAX_INTERVAL_S, 0, MAX_INTERVAL_S + 1, -1]),
    st.integers(min_value=1, max_value=MAX_INTERVAL_S),
)
offsets = st.sampled_from([UTC, timezone(timedelta(hours=14)), timezone(timedelta(hours=-12))])
EDGES = [MIN_TIME, MIN_TIME - TICK, MAX_TIME, MAX_TIME + TICK, datetime.min.replace(tzinfo=UTC)]
near_now = st.floats(min_value=-600, max_value=600).map(lambda s: NOW + timedelta(seconds=s))
moments = st.one_of(
    st.sampled_from([*EDGES, NOW - timedelta(days=1), NOW, NOW + timedelta(seconds=5)]),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=offsets),
    near_now,
    near_now,  # twice as likely: most schedules then have occurrences to make
).map(lambda moment: moment.isoformat())
graces = st.one_of(
    st.sampled_from([0, 60, MAX_GRACE_S, MAX_GRACE_S + 1, -1]),
    st.floats(min_value=0, max_value=MAX_GRACE_S),
)
timings = st.one_of(
    st.fixed_dictionaries({"cron": crons, "timezone": st.sampled_from(ZONES)}),
    st.fixed_dictionaries({"interval_s": intervals}),
    st.fixed_dictionaries({"cron": crons, "interval_s": intervals}),  # both: refused
)
schedules = st.tuples(
    timings,
    st.fixed_dictionaries(
        {"missed": st.sampled_from(["all", "latest", "skip"])},
        optional={"start_at": moments, "end_at": moments, "grace_s": graces},
    ),
).map(lambda parts: {**parts[0], **parts[1]})

CRASH = {"interval_s": 1, "start_at": "0001-01-01T00:00:00Z", "missed": "all"}  # issue 15


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url,
        amqp_url=amqp_url,
        node_id="fuzz-schedules",
        shard_count=8,
        schedule_poll_s=0.2,
        schedule_ahead_s=AHEAD_S,
        schedule_catchup_window_s=CATCHUP_S,
        schedule_min_interval_s=1,
    ) as running:
        yield running


def materialiser_task() -> asyncio.Task[Any]:
    [task] = [task for task in asyncio.all_tasks() if task.get_name() == "schedules"]
    return task


def check_made(probe: Probe, body: dict[str, Any], document: dict[str, Any]) -> int:
    """The schedule's jobs lie within its start and end and the catch-up window; returns how
    many there are."""
    rows = probe.fetch(
        "SELECT run_at FROM jobs WHERE idempotency_key LIKE $1", f"schedule:{body['name']}:%"
    )
    start_at = datetime.fromisoformat(document["start_at"])
    end_at = document["end_at"] and datetime.fromisoformat(document["end_at"])
    oldest = datetime.now(UTC) - timedelta(seconds=CATCHUP_S + 60)
    for row in rows:
        assert row["run_at"] >= start_at, (body, row)
        assert not end_at or row["run_at"] <= end_at, (body, row)
        if body["missed"] != "latest":  # latest fires the one missed before the window
            assert row["run_at"] >= oldest, (body, row)
    return len(rows)


def settled(probe: Probe, body: dict[str, Any]) -> dict[str, Any]:
    """The schedule once the node's materialiser has handled it: jobs made, or nothing due
    within the look-ahead yet, or ended. A parked one fails the test."""
    name = body["name"]
    for _ in range(100):
        document: dict[str, Any] = probe.send("GET", f"/v1/schedules/{name}").json()
        assert document["error"] is None, (body, document)
        next_at = document["next_at"] and datetime.fromisoformat(document["next_at"])
        horizon = datetime.now(UTC) + timedelta(seconds=AHEAD_S)
        if document["last_fired_at"] or not next_at or next_at > horizon:
            return document
        time.sleep(0.05)  # hypothesis's worker thread: the node runs on the test's loop
    raise AssertionError(f"not materialised: {body} -> {document}")


async def test_every_accepted_schedule_is_materialised_and_no_pass_fails(
    node: Node, database_url: str
) -> None:
    probe = Probe(node, database_url)
    names = itertools.count()
    outcomes: dict[str, int] = {}

    @settings(
        max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(body=schedules)
    @example(body=CRASH)
    @example(body={**CRASH, "start_at": "0001-01-02T00:00:00Z"})
    @example(body={**CRASH, "start_at": "9999-12-30T00:00:00Z", "end_at": "9999-12-30T00:00:00Z"})
    @example(body={"cron": "* * * * *", "timezone": "Pacific/Kiritimati", "missed": "latest"})
    @example(body={"cron": "30 2 * * *", "timezone": "America/New_York", "missed": "skip"})
    @example(body={"cron": "@yearly", "timezone": "Etc/GMT+12", "missed": "all", "grace_s": 0})
    def one(body: dict[str, Any]) -> None:
        body = {
            **body,
            "name": f"fuzz-{next(names)}",
            "job": {"routing_key": "fuzz.tick", "payload": {"n": 1}},
        }
        before = probe.stored("schedules")
        response = probe.post("/v1/schedules", json.dumps(body).encode())
        assert_answer(response)
        if not response.is_success:
            assert probe.stored("schedules") == before, body
            outcomes["refused"] = outcomes.get("refused", 0) + 1
            return
        document = settled(probe, body)
        made = check_made(probe, body, document)
        kind = "made jobs" if made else "ended" if not document["next_at"] else "not due yet"
        outcomes[kind] = outcomes.get(kind, 0) + 1
        probe.send("DELETE", f"/v1/schedules/{body['name']}")  # no more jobs from it

    try:
        await asyncio.to_thread(one)
        # The jobs due by now reached their end: published (none has a ttl to expire by).
        await until(lambda: nothing_left_to_fire(database_url), 60)
    finally:
        await probe.close()
    print(f"\nhypothesis: {sorted(outcomes.items())}")
    assert not materialiser_task().done()
    assert "dispatcher_schedules_parked_total 0.0" in node.core.metrics.render().decode()
    assert outcomes.get("made jobs")
    assert outcomes.get("refused")


async def nothing_left_to_fire(database_url: str) -> bool:
    connection = await asyncpg.connect(database_url)
    try:
        left = await connection.fetchval(
            "SELECT count(*) FROM jobs WHERE state IN ('scheduled', 'dispatching')"
            " AND run_at < now() - interval '1 second'"
        )
    finally:
        await connection.close()
    return left == 0
