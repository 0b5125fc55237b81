"""What a metered flow rule lets go (``FlowRuleStore.take``, sql/0017) on a real PostgreSQL: a
rate's bucket starts full, refills at the rate and is shared by every taker at once; a number in
flight frees a slot when its job finishes, when its ttl runs out after dispatch, or when the slot
times out, and never counts one job twice."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest

from consumers_sdk import ids
from dispatcher.store.db import Database
from dispatcher.store.flow_rules import FlowRuleStore, Meter

IDS = ids.JobIds()
KEY = "billing"


@pytest.fixture
def store(db: Database) -> FlowRuleStore:
    return FlowRuleStore(db, max_rules=10, max_rules_per_namespace=10)


async def stored_jobs(database_url: str, count: int) -> list[uuid.UUID]:
    """COUNT scheduled jobs of the key, due now, oldest first."""
    made = [IDS.next() for _ in range(count)]
    connection = await asyncpg.connect(database_url)
    try:
        await connection.executemany(
            "INSERT INTO jobs (id, shard, routing_key, payload, run_at)"
            " VALUES ($1, 0, 'billing.charge', '1', now())",
            [(job,) for job in made],
        )
    finally:
        await connection.close()
    return made


async def execute(database_url: str, statement: str, *args: object) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(statement, *args)
    finally:
        await connection.close()


async def test_a_rate_lets_go_its_burst_at_once_then_its_rate(store: FlowRuleStore) -> None:
    meter = Meter(rate_per_s=100, burst=10)
    wanted = [IDS.next() for _ in range(50)]
    filled = time.monotonic()  # no later than the bucket's first take
    first = await store.take(KEY, None, meter, wanted)
    assert first == tuple(wanted[:10])  # a bucket starts full: the burst, oldest first
    started = time.monotonic()
    # Right after the burst, only the tokens the rate brought since (one, on an idle machine;
    # a loaded one may take longer between the two takes).
    again = await store.take(KEY, None, meter, wanted[10:])
    assert len(again) <= 100 * (time.monotonic() - filled) + 1, len(again)
    await asyncio.sleep(0.05)
    refilled = await store.take(KEY, None, meter, wanted[10:])
    most = 100 * (time.monotonic() - started) + 1
    assert 4 <= len(refilled) <= most, (len(refilled), most)  # about 5: the rate's tokens
    assert refilled == tuple(wanted[10 : 10 + len(refilled)])
    await asyncio.sleep(0.5)
    assert len(await store.take(KEY, None, meter, wanted[20:])) == 10  # 50 refilled, capped
    # Another rule, and the same key in a namespace, have buckets of their own.
    assert len(await store.take(KEY, "shop", meter, wanted)) == 10
    assert await store.take(KEY, None, meter, []) == ()


async def test_takers_at_once_share_the_rate(db: Database) -> None:
    meter = Meter(rate_per_s=200, burst=20)
    stores = [FlowRuleStore(db, max_rules=10, max_rules_per_namespace=10) for _ in range(4)]
    let_go = 0
    started = time.monotonic()

    async def taker(store: FlowRuleStore) -> None:
        nonlocal let_go
        while time.monotonic() - started < 2.0:
            taken = await store.take(KEY, None, meter, [IDS.next() for _ in range(5)])
            let_go += len(taken)  # after the await: ``+=`` around it would read a stale count
            await asyncio.sleep(0.005)

    await asyncio.gather(*(taker(store) for store in stores))
    elapsed = time.monotonic() - started
    most = 200 * elapsed + 20
    assert let_go <= most, (let_go, most)  # never over the rate, however many take at once
    assert let_go >= 0.8 * 200 * 2.0, let_go  # and its tokens are taken


async def test_a_number_in_flight_frees_a_slot_when_its_job_ends(
    store: FlowRuleStore, database_url: str
) -> None:
    meter = Meter(max_in_flight=5, in_flight_timeout_s=60)
    jobs = await stored_jobs(database_url, 10)
    assert await store.take(KEY, None, meter, jobs) == tuple(jobs[:5])
    assert await store.take(KEY, None, meter, jobs[5:]) == ()
    # Let go again (a claim that did not happen): the same slot, not a second one.
    assert await store.take(KEY, None, meter, jobs[:1]) == tuple(jobs[:1])
    assert await store.take(KEY, None, meter, jobs[5:]) == ()
    # Two finish (a consumer said succeeded; one was cancelled): two slots come back.
    await execute(database_url, "UPDATE jobs SET state = 'succeeded' WHERE id = $1", jobs[0])
    await execute(database_url, "UPDATE jobs SET state = 'cancelled' WHERE id = $1", jobs[1])
    assert await store.take(KEY, None, meter, jobs[5:]) == tuple(jobs[5:7])
    # Dispatched with a ttl that ran out: its slot comes back; one still dispatching keeps its.
    await execute(
        database_url,
        "UPDATE jobs SET state = 'dispatched', ttl_ms = 100,"
        " dispatched_at = now() - interval '1 second' WHERE id = $1",
        jobs[2],
    )
    await execute(database_url, "UPDATE jobs SET state = 'dispatching' WHERE id = $1", jobs[3])
    assert await store.take(KEY, None, meter, jobs[7:]) == tuple(jobs[7:8])
    assert await store.take(KEY, None, meter, jobs[8:]) == ()


async def test_a_silent_jobs_slot_comes_back_after_the_timeout(
    store: FlowRuleStore, database_url: str
) -> None:
    meter = Meter(max_in_flight=2, in_flight_timeout_s=0.3)
    jobs = await stored_jobs(database_url, 4)
    assert await store.take(KEY, None, meter, jobs) == tuple(jobs[:2])
    await execute(database_url, "UPDATE jobs SET state = 'dispatched' WHERE id = ANY($1)", jobs)
    assert await store.take(KEY, None, meter, jobs[2:]) == ()
    await asyncio.sleep(0.4)  # the consumer never said: the slots time out
    assert await store.take(KEY, None, meter, jobs[2:]) == tuple(jobs[2:])


async def test_a_rate_and_a_number_in_flight_together_let_go_the_fewer(
    store: FlowRuleStore, database_url: str
) -> None:
    jobs = await stored_jobs(database_url, 10)
    both = Meter(rate_per_s=1, burst=3, max_in_flight=8, in_flight_timeout_s=60)
    assert await store.take(KEY, None, both, jobs) == tuple(jobs[:3])  # the burst
    slots = Meter(rate_per_s=1000, burst=1000, max_in_flight=4, in_flight_timeout_s=60)
    assert await store.take("mail", None, slots, jobs) == tuple(jobs[:4])  # the slots
