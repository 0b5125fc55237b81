"""Property-based tests (hypothesis) of the job API of an in-process node against real PostgreSQL
and RabbitMQ: whatever the body, the answer is a stored job or a 4xx JSON error naming the field
at fault, never a 5xx, and a refused request stores nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers_sdk import validation
from dispatcher.node import Node
from tests.support.nodes import running_node
from tests.support.probe import REFUSALS, Probe, assert_answer

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**80),  # around 64 bits, where encoders give up
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
routing_keys = st.one_of(
    st.from_regex(r"\A[a-z0-9_:-]{1,12}(\.[a-z0-9_:-]{1,12}){0,3}\Z"),  # valid words
    st.text(max_size=300),
    json_scalars,
)
moments = st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=14))]))
header_values = st.one_of(
    # Storable text: PostgreSQL holds neither NUL nor lone surrogates (refused by name elsewhere).
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=50),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    # Floats travel as AMQP 32-bit floats: larger ones are refused by name (elsewhere).
    st.floats(-validation.FLOAT32_MAX, validation.FLOAT32_MAX),
)
valid_values = st.recursive(
    st.none() | header_values,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
job_fields: dict[str, st.SearchStrategy[Any]] = {
    "routing_key": routing_keys,
    "payload": json_values
    | st.integers(0, 4).map(lambda n: "x" * (n * 100_000)),  # 413 above 256 KiB
    "delay_ms": st.one_of(st.integers(min_value=-10, max_value=2**70), json_scalars),
    "run_at": st.one_of(moments.map(datetime.isoformat), st.text(max_size=30), json_scalars),
    "idempotency_key": st.one_of(
        st.text(max_size=300), st.sampled_from(["k1", "k2"]), json_scalars
    ),
    "on_existing": st.one_of(st.sampled_from(["keep", "replace", "extend"]), json_scalars),
    "release_key": st.one_of(st.sampled_from(["never", "dispatched", "finished"]), json_scalars),
    "headers": st.one_of(
        st.dictionaries(st.text(max_size=40), json_values, max_size=40), json_scalars
    ),
    "priority": st.one_of(st.integers(min_value=-3, max_value=12), json_scalars),
    "ttl_ms": st.one_of(st.integers(min_value=-3, max_value=10**12), json_scalars),
    "colour": json_scalars,  # not a field of the API
}
jobs = st.fixed_dictionaries({}, optional=job_fields)


@pytest.fixture
async def node(database_url: str, amqp_url: str) -> AsyncIterator[Node]:
    async with running_node(
        database_url=database_url, amqp_url=amqp_url, node_id="fuzz", shard_count=16
    ) as running:
        yield running


def check_post(probe: Probe, path: str, body: bytes) -> httpx.Response:
    before = probe.stored()
    response = probe.post(path, body)
    assert_answer(response)
    if not response.is_success:
        assert probe.stored() == before, f"refused but stored: {body[:300]!r}"
    return response


FUZZ = settings(
    max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


async def test_no_job_body_crashes_the_api_and_a_refused_one_stores_nothing(
    node: Node, database_url: str
) -> None:
    probe = Probe(node, database_url)
    answers: dict[int, int] = {}

    @FUZZ
    @given(job=jobs)
    def one(job: dict[str, Any]) -> None:
        response = check_post(probe, "/v1/jobs", json.dumps(job).encode())
        answers[response.status_code] = answers.get(response.status_code, 0) + 1

    @FUZZ
    @given(batch=st.one_of(st.lists(jobs, max_size=5), json_values))
    def batch(batch: Any) -> None:
        response = check_post(probe, "/v1/jobs/batch", json.dumps({"jobs": batch}).encode())
        answers[response.status_code] = answers.get(response.status_code, 0) + 1

    @FUZZ
    @given(body=st.binary(max_size=200) | json_values.map(lambda value: json.dumps(value).encode()))
    def raw(body: bytes) -> None:
        for path in ("/v1/jobs", "/v1/jobs/batch"):
            response = check_post(probe, path, body)
            answers[response.status_code] = answers.get(response.status_code, 0) + 1

    try:
        for prop in (one, batch, raw):
            await asyncio.to_thread(prop)
    finally:
        await probe.close()
    print(f"\nhypothesis: answers {sorted(answers.items())}")
    assert set(answers) <= {200, 201} | REFUSALS


async def test_a_valid_job_is_stored_once_whatever_its_contents(
    node: Node, database_url: str
) -> None:
    probe = Probe(node, database_url)
    future = datetime.now(UTC) + timedelta(days=1)  # stored, not fired while the test runs

    @FUZZ
    @given(
        routing_key=st.from_regex(r"\A[A-Za-z0-9_:-]{1,20}(\.[A-Za-z0-9_:-]{1,20}){0,4}\Z"),
        payload=valid_values,
        headers=st.dictionaries(
            st.from_regex(r"\A[a-w][a-z0-9-]{0,20}\Z"), header_values, max_size=8
        ),
        priority=st.none() | st.integers(min_value=0, max_value=9),
    )
    def stored(
        routing_key: str, payload: Any, headers: dict[str, Any], priority: int | None
    ) -> None:
        job = {
            "routing_key": routing_key,
            "payload": payload,
            "headers": headers,
            "priority": priority,
            "run_at": future.isoformat(),
        }
        before = probe.stored()
        response = probe.post("/v1/jobs", json.dumps(job).encode())
        assert response.status_code == 201, response.text
        assert response.json()["payload"] == payload
        assert probe.stored() == before + 1

    try:
        await asyncio.to_thread(stored)
    finally:
        await probe.close()
