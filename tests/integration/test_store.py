"""JobStore and ShardStore against a real PostgreSQL (a fresh database per test)."""

import asyncio
import dataclasses
import importlib
import pkgutil
import uuid
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

import asyncpg
import pytest

from consumers_sdk import ids
from dispatcher import errors, models
from dispatcher.store import jobs as jobs_store
from dispatcher.store import migrate, queries
from dispatcher.store.db import Database
from dispatcher.store.jobs import JobStore
from dispatcher.store.queries import intake as intake_sql
from dispatcher.store.queries import migrate as migrate_sql
from dispatcher.store.queries import scheduler, shared
from dispatcher.store.queries import shards as shards_sql
from dispatcher.store.shards import ShardStore

IDS = ids.JobIds()
NOW = datetime.now(UTC)


@pytest.fixture
async def shards(db: Database) -> ShardStore:
    store = ShardStore(db)
    await store.ensure(8)
    return store


def due(*jobs: models.NewJob) -> list[models.DueEntry]:
    return [models.DueEntry.make(job.spec.run_at.timestamp(), job.id, job.shard) for job in jobs]


def new_job(
    shard: int = 0,
    *,
    key: str | None = None,
    run_at: datetime = NOW,
    payload: bytes = b'{"order": 1}',
    priority: int | None = None,
    ttl_ms: int | None = None,
    namespace: str | None = None,
) -> models.NewJob:
    spec = models.JobSpec(
        routing_key="orders.expire",
        payload=payload,
        run_at=run_at,
        idempotency_key=key,
        headers={"tenant": "a", "n": 1},
        priority=priority,
        ttl_ms=ttl_ms,
    )
    return models.NewJob(id=IDS.next(), shard=shard, spec=spec, namespace=namespace)


def statement_families() -> list[ModuleType]:
    """Every module of ``store.queries`` but ``shared``, whose fragments are not statements."""
    return [
        importlib.import_module(f"{queries.__name__}.{module.name}")
        for module in pkgutil.iter_modules(queries.__path__)
        if module.name != "shared"
    ]


async def test_every_query_prepares_against_the_migrated_schema(database_url: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        statements = {
            name: value
            for family in statement_families()
            for name, value in vars(family).items()
            # A leading underscore marks a fragment that statements are built from.
            if name.isupper()
            and not name.startswith("_")
            and isinstance(value, str)
            and name not in vars(shared)  # fragments (imported by the families that use them)
        }
        assert {"CLAIM_JOBS", "ENQUEUE_JOBS", "BULK_CANCEL", "READ_CLOCK"} <= statements.keys()
        for name, sql in statements.items():
            if name.startswith("MIGRATION") or name == "CREATE_MIGRATIONS_TABLE":
                continue
            await connection.prepare(sql)
    finally:
        await connection.close()


async def test_migrations_are_recorded_and_a_second_run_is_a_no_op(database_url: str) -> None:
    assert await migrate.apply_migrations(database_url) == []
    connection = await asyncpg.connect(database_url)
    try:
        versions = [r["version"] for r in await connection.fetch(migrate_sql.APPLIED_MIGRATIONS)]
    finally:
        await connection.close()
    assert sorted(versions) == [migration.version for migration in migrate.migration_files()]


async def test_insert_roundtrips_a_job(db: Database) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    job = new_job()
    [result] = await store.insert([job])
    assert result.created
    stored = await store.get(job.id)
    assert stored.state is models.JobState.SCHEDULED
    assert stored.payload == job.spec.payload
    assert stored.headers == {"tenant": "a", "n": 1}


async def test_a_job_inserted_alone_is_stored_as_one_inserted_in_a_batch(db: Database) -> None:
    # One job takes a plain INSERT, a batch the contract function: the rows must not differ.
    store = JobStore(db, node_id="n1", lease_s=30)
    fields: dict[str, Any] = {"priority": 7, "ttl_ms": 60_000, "namespace": "team-a"}
    alone = new_job(key="alone", **fields)
    batched = new_job(key="batched", **fields)
    [one] = await store.insert([alone])
    [first, _] = await store.insert([batched, new_job()])
    assert one.created
    assert first.created
    rows = [await store.get(job.id) for job in (alone, batched)]
    assert [one.job, first.job] == rows  # what the API answers is what was stored
    differ = {"id", "idempotency_key", "created_at", "updated_at"}
    as_dicts = [
        {k: v for k, v in dataclasses.asdict(row).items() if k not in differ} for row in rows
    ]
    assert as_dicts[0] == as_dicts[1]
    [again] = await store.insert([new_job(key="alone", **fields)])
    assert not again.created
    assert again.job.id == alone.id  # the key is kept per namespace by the plain INSERT too


# (the stored job's namespace, the new one's, whether they share a key): the new one inserted?
CONFLICT_CASES = [
    (None, None, True, False),
    ("team-a", "team-a", True, False),
    (None, "", True, False),  # NULL and '' both name the default namespace
    ("team-a", "team-b", True, True),
    ("team-a", None, True, True),
    (None, None, False, True),  # no key: nothing to conflict on
]


async def test_the_plain_insert_is_the_contract_function_for_one_job(database_url: str) -> None:
    """INSERT_JOB / INSERT_KEYED_JOB (a second path, for one job without or with a key:
    ``bench/insert_paths.py`` shows its gain) against ENQUEUE_JOBS (``dispatcher_enqueue_v3``,
    every batch): the same row for the same job, and the same idempotency rule, case by case."""

    def insert(path: str, job: models.NewJob) -> tuple[object, ...]:
        if path == "INSERT_JOB":
            return (jobs_store.single_insert(job), *jobs_store.insert_values(job))
        arrays = jobs_store.insert_arrays([job])
        return (intake_sql.ENQUEUE_JOBS, *arrays, [None], ["keep"], "test")

    connection = await asyncpg.connect(database_url)

    async def stored(*steps: tuple[str, models.NewJob]) -> tuple[bool, dict[str, object]]:
        """Store each job by its path in a transaction rolled back: whether the last one was
        inserted, and its row."""
        transaction = connection.transaction()
        await transaction.start()
        try:
            for path, job in steps:
                returned = await connection.fetch(*insert(path, job))
            last = steps[-1][1]
            row = await connection.fetchrow("SELECT * FROM jobs WHERE id = $1", last.id)
            if path == "INSERT_JOB":  # a row back only when inserted
                created = len(returned) == 1
            else:
                created = [r["outcome"] for r in returned] == ["created"]
            return created and row is not None, dict(row or {})
        finally:
            await transaction.rollback()

    try:
        await connection.execute(shards_sql.ENSURE_SHARDS, 8)
        bare = dataclasses.replace(new_job(), spec=dataclasses.replace(new_job().spec, headers={}))
        paths = ("INSERT_JOB", "ENQUEUE_JOBS")
        for job in (new_job(3, key="k", priority=7, ttl_ms=60_000, namespace="team-a"), bare):
            rows = [(await stored((path, job)))[1] for path in paths]
            assert rows[0]["id"] == job.id
            for row in rows:  # now() and the round differ from one transaction to the next
                assert isinstance(row.pop("dispatch_round"), uuid.UUID)
                del row["created_at"], row["updated_at"]
            assert rows[0] == rows[1]

        for first_namespace, namespace, same_key, inserted in CONFLICT_CASES:
            first = new_job(key="k", namespace=first_namespace)
            second = new_job(key="k" if same_key else "other", namespace=namespace)
            for first_path in paths:  # the first job stored by either path, the second by each
                for path in paths:
                    outcome, row = await stored((first_path, first), (path, second))
                    case = (first_namespace, namespace, same_key, first_path, path)
                    assert outcome is inserted, case
                    assert bool(row) is inserted, case
    finally:
        await connection.close()


async def test_idempotency_key_returns_the_first_job(db: Database) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    first = new_job(key="order-1")
    [created] = await store.insert([first])
    again = new_job(key="order-1")
    [existing, other] = await store.insert([again, new_job(key="order-2")])
    assert created.created
    assert not existing.created
    assert other.created
    assert existing.job.id == first.id
    with pytest.raises(errors.JobNotFound):
        await store.get(again.id)


async def test_concurrent_submissions_with_one_key_create_one_job(db: Database) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    results = await asyncio.gather(*(store.insert([new_job(key="same")]) for _ in range(4)))
    assert sum(r[0].created for r in results) == 1
    assert len({r[0].job.id for r in results}) == 1


async def test_cancel_only_scheduled_jobs(db: Database, shards: ShardStore) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    a, b = new_job(), new_job()
    await store.insert([a, b])
    assert (await store.cancel(a.id)).state is models.JobState.CANCELLED
    epochs = await shards.bump([0], "n1")
    assert [j.id for j in (await store.claim(due(a, b), epochs)).jobs] == [b.id]
    with pytest.raises(errors.JobStateConflict) as caught:
        await store.cancel(b.id)
    assert caught.value.state == "dispatching"
    with pytest.raises(errors.JobNotFound):
        await store.cancel(uuid.uuid4())


async def test_claim_is_fenced_by_the_shard_epoch(db: Database, shards: ShardStore) -> None:
    old_owner = JobStore(db, node_id="old", lease_s=30)
    new_owner = JobStore(db, node_id="new", lease_s=30)
    job = new_job(shard=3)
    await old_owner.insert([job])
    stale = await shards.bump([3], "old")
    await shards.bump([3], "new")  # takeover
    assert (await old_owner.claim(due(job), stale)).jobs == []
    current = {3: (await shards.bump([3], "new"))[3]}
    [claimed] = (await new_owner.claim(due(job), current)).jobs
    assert claimed.id == job.id
    stored = await new_owner.get(job.id)
    assert stored.state is models.JobState.DISPATCHING
    assert stored.publish_attempts == 1


async def test_a_claim_takes_no_job_postgresqls_clock_has_not_reached_within_the_fence(
    db: Database, shards: ShardStore
) -> None:
    """Whatever the entries say (a node whose clock runs ahead hands in jobs not yet due), the
    claim reads PostgreSQL's clock and takes only jobs due within ``ahead_s`` of it."""
    store = JobStore(db, node_id="n1", lease_s=30)
    soon = new_job(shard=2, run_at=datetime.now(UTC) + timedelta(seconds=5))
    later = new_job(shard=2, run_at=datetime.now(UTC) + timedelta(seconds=20))
    await store.insert([soon, later])
    epochs = await shards.bump([2], "n1")

    claim = await store.claim(due(soon, later), epochs, ahead_s=10)
    assert [job.id for job in claim.jobs] == [soon.id]
    assert claim.fenced_at_s == pytest.approx(datetime.now(UTC).timestamp(), abs=1.0)
    assert claim.fenced_at_s <= claim.answered_at_s < soon.spec.run_at.timestamp()  # claimed ahead
    assert (await store.get(later.id)).state is models.JobState.SCHEDULED

    nothing = await store.claim(due(later), epochs)  # no fence tolerance: nothing ahead at all
    assert nothing.jobs == []
    assert nothing.fenced_at_s >= claim.answered_at_s  # the clocks, even with no row claimed


async def test_a_claim_returns_each_column_as_its_field(db: Database, shards: ShardStore) -> None:
    """The claim's row is unpacked by position: every field distinct, so a swap would show."""
    store = JobStore(db, node_id="n1", lease_s=30)
    job = new_job(shard=5, key="claim-fields", priority=7, ttl_ms=86_400_000)
    await store.insert([job])
    [claimed] = (await store.claim(due(job), await shards.bump([5], "n1"))).jobs
    assert claimed == models.Claimed(
        id=job.id,
        shard=5,
        routing_key="orders.expire",
        payload=b'{"order": 1}',
        run_at=NOW,
        idempotency_key="claim-fields",
        headers={"tenant": "a", "n": 1},
        priority=7,
        ttl_ms=86_400_000,
        dispatch_round=claimed.dispatch_round,
    )
    assert isinstance(claimed.dispatch_round, uuid.UUID)
    assert claimed.dispatch_round not in (job.id, claimed.id)


async def test_a_claim_is_not_taken_twice_until_its_lease_expires(
    db: Database, shards: ShardStore
) -> None:
    store = JobStore(db, node_id="n1", lease_s=0.3)
    job = new_job(shard=1)
    await store.insert([job])
    epochs = await shards.bump([1], "n1")
    assert len((await store.claim(due(job), epochs)).jobs) == 1
    assert (await store.claim(due(job), epochs)).jobs == []
    assert (await store.expired_leases([1], 10))[0] == []
    await asyncio.sleep(0.5)
    [expired], looked_at = await store.expired_leases([1], 10)
    assert expired.id == job.id
    assert (await store.expired_leases([1], 10, since=looked_at))[0] == []
    [again] = (await store.claim(due(job), epochs)).jobs
    assert again.id == job.id
    assert (await store.get(job.id)).publish_attempts == 2


async def test_mark_release_and_expire(db: Database, shards: ShardStore) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    a, b, c = new_job(), new_job(), new_job()
    await store.insert([a, b, c])
    epochs = await shards.bump([0], "n1")
    await store.claim(due(a, b, c), epochs)
    await store.mark_dispatched([a.id])
    await store.release([b.id])
    await store.mark_expired([c.id])
    assert (await store.get(a.id)).state is models.JobState.DISPATCHED
    assert (await store.get(a.id)).dispatched_at is not None
    assert (await store.get(b.id)).state is models.JobState.SCHEDULED
    assert (await store.get(c.id)).state is models.JobState.EXPIRED


async def test_the_mark_commits_without_waiting_for_the_disk_and_only_itself(
    database_url: str, db: Database, shards: ShardStore
) -> None:
    """``MARK_DISPATCHED`` runs with ``synchronous_commit`` off (read at its commit), and the
    setting ends with its transaction: the connection's next statements wait for the disk."""
    store = JobStore(db, node_id="n1", lease_s=30)
    job = new_job()
    await store.insert([job])
    await store.claim(due(job), await shards.bump([0], "n1"))
    connection = await asyncpg.connect(database_url)
    try:
        marked = await connection.fetch(
            scheduler.MARK_DISPATCHED + " RETURNING current_setting('synchronous_commit')",
            [job.id],
        )
        assert [row[0] for row in marked] == ["off"]
        assert await connection.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await connection.close()
    assert (await store.get(job.id)).state is models.JobState.DISPATCHED


async def test_load_due_walks_the_window_in_order_with_a_keyset(db: Database) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    jobs = [new_job(shard=i % 4, run_at=NOW + timedelta(seconds=i)) for i in range(10)]
    await store.insert(jobs)
    start = (datetime(1970, 1, 1, tzinfo=UTC), uuid.UUID(int=0))
    first, last = await store.load_due([0, 1, 2, 3], after=start, until=NOW + timedelta(1), limit=4)
    assert [e.id for e in first] == [j.id for j in jobs[:4]]
    assert last is not None
    rest, _ = await store.load_due([0, 1], after=last, until=NOW + timedelta(seconds=7), limit=100)
    assert [e.id for e in rest] == [j.id for j in jobs[4:8] if j.shard in (0, 1)]


async def test_shard_count_cannot_change(db: Database, shards: ShardStore) -> None:
    with pytest.raises(errors.ShardCountMismatch):
        await ShardStore(db).ensure(16)


async def test_page_filters_and_follows_the_cursor(db: Database) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    jobs = [new_job() for _ in range(5)]
    await store.insert(jobs)
    page, more = await store.page(
        state=models.JobState.SCHEDULED, routing_key=None, after=None, limit=3
    )
    assert ([j.id for j in page], more) == ([j.id for j in jobs[:3]], True)
    rest, more = await store.page(
        state=None, routing_key="orders.expire", after=page[-1].id, limit=3
    )
    assert ([j.id for j in rest], more) == ([j.id for j in jobs[3:]], False)
    assert await store.page(state=None, routing_key="other", after=None, limit=3) == ([], False)


async def test_scheduled_jobs_page_in_due_order_and_other_states_in_id_order(
    db: Database,
) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    # Made in id order, due in the reverse one: the last made fires first.
    jobs = [new_job(run_at=NOW + timedelta(hours=1, seconds=-n)) for n in range(5)]
    await store.insert(jobs)
    due_first = [job.id for job in reversed(jobs)]
    for routing_key in (None, "orders.expire"):
        pages, after, more = [], None, True
        while more:
            page, more = await store.page(
                state=models.JobState.SCHEDULED, routing_key=routing_key, after=after, limit=2
            )
            pages += [job.id for job in page]
            after = page[-1].id
        assert pages == due_first
    await store.cancel(jobs[1].id)
    await store.cancel(jobs[3].id)
    cancelled, _ = await store.page(
        state=models.JobState.CANCELLED, routing_key=None, after=None, limit=9
    )
    assert [job.id for job in cancelled] == [jobs[1].id, jobs[3].id]
    every, _ = await store.page(state=None, routing_key=None, after=None, limit=9)
    assert [job.id for job in every] == [job.id for job in jobs]


async def test_a_page_ends_past_its_bytes_of_payloads_and_says_more_follow(db: Database) -> None:
    store = JobStore(db, node_id="n1", lease_s=30)
    jobs = [new_job(payload=b'"' + b"x" * 998 + b'"') for _ in range(5)]  # 1 000 bytes each
    await store.insert(jobs)
    pages = []
    after = None
    while True:
        page, more = await store.page(
            state=None, routing_key=None, after=after, limit=100, max_bytes=2_500
        )
        pages.append([job.id for job in page])
        if not more:
            break
        after = page[-1].id
    # Each page starts while under 2 500 bytes: three jobs (2 000 before the third), then two.
    assert pages == [[j.id for j in jobs[:3]], [j.id for j in jobs[3:]]]
    one, more = await store.page(state=None, routing_key=None, after=None, limit=9, max_bytes=1)
    assert (len(one), more) == (1, True)  # one job at least, however large
