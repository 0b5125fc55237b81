"""Namespaces in JobStore against a real PostgreSQL: one INSERT may carry several namespaces (the
group commit mixes requests), and idempotency keys and reads stay within each."""

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from consumers_sdk import ids
from dispatcher import errors, models
from dispatcher.auth import api_keys
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore
from tests.support.words import WITHIN_CASES

IDS = ids.JobIds()


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[JobStore]:
    database = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await database.open()
    yield JobStore(database, node_id="ns-test", lease_s=30)
    await database.close()


def new_job(namespace: str | None, key: str | None = "same") -> models.NewJob:
    spec = models.JobSpec(
        routing_key="orders.expire",
        payload=b"1",
        run_at=datetime.now(UTC),
        idempotency_key=key,
        headers={},
    )
    return models.NewJob(id=IDS.next(), shard=0, spec=spec, namespace=namespace)


async def test_one_batch_keeps_idempotency_keys_apart_per_namespace(store: JobStore) -> None:
    first = await store.insert([new_job("a"), new_job("b"), new_job(None)])
    assert [r.created for r in first] == [True, True, True]
    again = await store.insert([new_job(None), new_job("b"), new_job("c")])
    assert [r.created for r in again] == [False, False, True]
    assert again[0].job.id == first[2].job.id
    assert again[1].job.id == first[1].job.id
    assert [r.job.namespace for r in again] == [None, "b", "c"]


async def test_reads_and_cancels_are_confined_to_the_namespace_filter(store: JobStore) -> None:
    [a, default] = await store.insert([new_job("a", None), new_job(None, None)])
    assert (await store.get(a.job.id, namespace="a")).id == a.job.id
    assert (await store.get(a.job.id)).id == a.job.id  # no filter: every namespace
    with pytest.raises(errors.JobNotFound):
        await store.get(a.job.id, namespace="")
    with pytest.raises(errors.JobNotFound):
        await store.cancel(default.job.id, namespace="a")
    listed, _ = await store.page(state=None, routing_key=None, after=None, limit=10, namespace="")
    assert [job.id for job in listed] == [default.job.id]
    assert (await store.cancel(default.job.id, namespace="")).state is models.JobState.CANCELLED


async def test_the_stores_routing_key_filter_is_the_keys_word_rule(store: JobStore) -> None:
    """Two paths, one rule: ``api_keys.within`` (what a key may create) and the SQL of every read
    and change (what it may see), case by case."""
    cases = WITHIN_CASES
    jobs = [new_job(None, key=f"w{index}") for index in range(len(cases))]
    jobs = [
        dataclasses.replace(job, spec=dataclasses.replace(job.spec, routing_key=routing_key))
        for job, (_, routing_key, _) in zip(jobs, cases, strict=True)
    ]
    await store.insert(jobs)
    for job, (prefix, routing_key, within) in zip(jobs, cases, strict=True):
        words = [api_keys.words(prefix)]
        assert api_keys.within(routing_key, words[0]) is within
        listed, _ = await store.page(
            state=None, routing_key=routing_key, after=None, limit=50, routing_keys=words
        )
        assert (job.id in [found.id for found in listed]) is within, (prefix, routing_key)
        if within:
            assert (await store.get(job.id, routing_keys=words)).id == job.id
        else:
            with pytest.raises(errors.JobNotFound):
                await store.get(job.id, routing_keys=words)
            with pytest.raises(errors.JobNotFound):
                await store.cancel(job.id, routing_keys=words)
