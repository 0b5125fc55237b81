"""Namespaces in JobStore against a real PostgreSQL: one INSERT may carry several namespaces (the
group commit mixes requests), and idempotency keys and reads stay within each."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from consumers_sdk import ids
from dispatcher import errors, models
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore

IDS = ids.JobIds()


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[JobStore]:
    database = Database(database_url, min_size=1, max_size=2, timeout_s=5)
    await database.open()
    yield JobStore(database, node_id="ns-test", lease_s=30)
    await database.close()


def new_job(namespace: str | None, key: str | None = "same") -> models.NewJob:
    return models.NewJob(
        id=IDS.next(),
        shard=0,
        routing_key="orders.expire",
        payload=b"1",
        run_at=datetime.now(UTC),
        idempotency_key=key,
        headers={},
        namespace=namespace,
    )


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
    listed = await store.page(state=None, routing_key=None, after=None, limit=10, namespace="")
    assert [job.id for job in listed] == [default.job.id]
    assert (await store.cancel(default.job.id, namespace="")).state is models.JobState.CANCELLED
