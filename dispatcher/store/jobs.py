"""JobStore: the only code that runs SQL on jobs. Every hot path is one round trip per batch."""

from __future__ import annotations

import contextlib
import operator
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final, NamedTuple

import asyncpg
import orjson

from dispatcher import errors, models
from dispatcher.auth import api_keys
from dispatcher.flow import rules
from dispatcher.store import dependencies
from dispatcher.store.db import Database
from dispatcher.store.queries import intake, job_reads, scheduler

_CURSOR_START = uuid.UUID(int=0)
# Scheduler statements may legitimately run longer than an API request is allowed to wait.
SCHEDULER_TIMEOUT_S = 30.0
# Before any lease: a look at the leases run out since EVER is a look at all of them.
EVER: Final = datetime(1, 1, 1, tzinfo=UTC)
# A change of a pending job fences its shard again when the job moved meanwhile (a requeue): a
# second time in practice, never a third.
_FENCE_TRIES: Final = 3


def job_from_row(row: asyncpg.Record) -> models.Job:
    released_key = row.get("released_key")
    return models.Job(
        id=row["id"],
        shard=row["shard"],
        state=models.JobState(row["state"]),
        routing_key=row["routing_key"],
        payload=bytes(row["payload"]),
        run_at=row["run_at"],
        idempotency_key=row["idempotency_key"] if released_key is None else released_key,
        headers=_headers(row["headers"]),
        priority=row["priority"],
        ttl_ms=row["ttl_ms"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        dispatched_at=row["dispatched_at"],
        publish_attempts=row["publish_attempts"],
        namespace=row["namespace"],
        last_error=row["last_error"],
        release_key=models.KeyRelease(row.get("key_release") or models.KeyRelease.NEVER),
        key_released=released_key is not None,
    )


def _headers(text: str) -> Mapping[str, models.HeaderValue]:
    """A row's headers; a row written by hand with something else than an object shows none
    (firing parks such a job: see ``claimed_from_row``)."""
    headers = orjson.loads(text)
    return headers if isinstance(headers, dict) else {}


# CLAIM_JOBS's two clocks come before the claimed columns.
_CLAIM_CLOCKS = 2
_CLAIMED_HEADERS = scheduler.CLAIMED_COLUMNS.index("headers")


def claimed_from_row(row: asyncpg.Record) -> models.Claimed:
    """A row of ``CLAIM_JOBS``, whose columns after its clocks are ``Claimed``'s fields in order
    (``scheduler.CLAIMED_COLUMNS``): passed by position (the hot path: no lookups by name); only
    the headers need decoding."""
    values = list(row[_CLAIM_CLOCKS:])
    values[_CLAIMED_HEADERS] = orjson.loads(values[_CLAIMED_HEADERS])
    return models.Claimed(*values)


def entry_from_row(row: asyncpg.Record) -> models.DueEntry:
    key = models.routing_key_of(row["routing_key"])
    return models.DueEntry.make(
        row["run_at"].timestamp(), row["id"], row["shard"], key, row["priority"]
    )


def _refuse_foreign(
    jobs: Sequence[models.NewJob],
    answers: Sequence[_Answer],
    existing: Mapping[uuid.UUID, models.Job],
) -> None:
    """IdempotencyKeyTaken for the first job whose key names a job outside its submitter's
    prefixes: that job is neither shown nor changed (a replace or extend changes only a job of
    the same routing key, so only a kept or refused answer can name one)."""
    for index, (job, answer) in enumerate(zip(jobs, answers, strict=True)):
        if answer.created or job.routing_scope is None:
            continue
        holder = existing[answer.id]
        if not any(api_keys.within(holder.routing_key, w) for w in job.routing_scope):
            raise errors.IdempotencyKeyTaken(index)


class JobStore:
    def __init__(
        self,
        db: Database,
        *,
        node_id: str,
        lease_s: float,
    ) -> None:
        self._db = db
        self._node_id = node_id
        self._lease_s = lease_s

    # --- intake ---------------------------------------------------------------------------------

    async def insert(self, jobs: Sequence[models.NewJob]) -> list[models.Submitted]:
        """Store a batch atomically; a job whose idempotency key exists returns created=False.
        JobRefused when PostgreSQL refuses a value (nothing of the batch is stored)."""
        try:
            return await self._insert(jobs)
        except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as exc:
            raise errors.JobRefused(str(exc)) from exc

    async def _insert(self, jobs: Sequence[models.NewJob]) -> list[models.Submitted]:
        if not jobs:
            return []
        with_prerequisites = any(job.spec.after for job in jobs)
        # A key may name a job outside the caller's prefixes: the batch is refused, so the jobs
        # stored before that answer is known are rolled back with it.
        scoped_keys = len(jobs) > 1 and any(
            job.routing_scope is not None and job.spec.idempotency_key for job in jobs
        )
        waiting: set[uuid.UUID] = set()
        # One statement is atomic and durable on its own: a transaction would only add the BEGIN
        # and COMMIT round trips to every request's wait. Prerequisites are written with their
        # jobs, all or nothing. Existing jobs are read after the insert, as read committed would
        # inside a transaction.
        async with (
            self._db.connection() as connection,
            connection.transaction()
            if with_prerequisites or scoped_keys
            else contextlib.nullcontext(),
        ):
            answers = await self._store(connection, jobs)
            existing = await _rows(connection, [a.id for a in answers if not a.created])
            _refuse_foreign(jobs, answers, existing)
            inserted = {answer.id: answer.created_at for answer in answers if answer.created}
            if with_prerequisites:
                waiting = await dependencies.attach(
                    connection,
                    jobs,
                    resolved=[answer.id for answer in answers],
                    created=inserted.keys(),
                )
        results: list[models.Submitted] = []
        for job, answer in zip(jobs, answers, strict=True):
            if answer.outcome is models.Outcome.CREATED:
                state = models.JobState.WAITING if job.id in waiting else models.JobState.SCHEDULED
                stored = as_stored(job, answer.created_at, state)
            else:
                stored = existing[answer.id]
            results.append(models.Submitted(job=stored, outcome=answer.outcome))
        return results

    async def _store(
        self, connection: asyncpg.pool.PoolConnectionProxy, jobs: Sequence[models.NewJob]
    ) -> list[_Answer]:
        """Every batch through ``ENQUEUE_JOBS``; one job that asks nothing of its key but to
        keep it through a plain insert first (``single_insert``), the faster statement for one
        row, and through ``ENQUEUE_JOBS`` only when its key names a job already."""
        if len(jobs) == 1 and not jobs[0].spec.keyed:
            created_at = await connection.fetchval(single_insert(jobs[0]), *insert_values(jobs[0]))
            if created_at is not None:
                return [_Answer(jobs[0].id, created_at, models.Outcome.CREATED)]
        releases = [
            None if job.spec.release_key is models.KeyRelease.NEVER else job.spec.release_key.value
            for job in jobs
        ]
        rows = await connection.fetch(
            intake.ENQUEUE_JOBS,
            *insert_arrays(jobs),
            releases,
            [job.spec.on_existing.value for job in jobs],
            self._node_id,
        )
        return [
            _Answer(row["id"], row["created_at"], models.Outcome(row["outcome"])) for row in rows
        ]

    # --- reads and cancel -----------------------------------------------------------------------

    # ``namespace`` filters: None for every namespace, "" for the default one, else its name.
    # ``routing_keys`` filters too: None for any, else the words a key's prefixes name
    # (``api_keys.Principal.routing_key_filter``). A job outside the filters is not found, so its
    # id reveals nothing.

    async def get(
        self,
        job_id: uuid.UUID,
        *,
        namespace: str | None = None,
        routing_keys: Sequence[str] | None = None,
    ) -> models.Job:
        async with self._db.connection() as connection:
            row = await connection.fetchrow(job_reads.SELECT_JOB, job_id, namespace, routing_keys)
        if row is None:
            raise errors.JobNotFound()
        return job_from_row(row)

    async def page(
        self,
        *,
        state: models.JobState | None,
        routing_key: str | None,
        after: uuid.UUID | None,
        limit: int,
        namespace: str | None = None,
        routing_keys: Sequence[str] | None = None,
        max_bytes: int = 2**62,
        routing_key_prefix: str | None = None,
    ) -> tuple[list[models.Job], bool]:
        """A page, and whether more may follow: the page was full, or ended past ``max_bytes``
        of payloads (a page holds one job at least). ``routing_key_prefix`` is words without the
        final dot: billing lists billing and billing.*."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(
                job_reads.LIST_JOBS,
                state.value if state else None,
                routing_key,
                after or _CURSOR_START,
                limit,
                namespace,
                routing_keys,
                max_bytes,
                routing_key_prefix,
            )
        more = bool(rows) and (len(rows) == limit or rows[0]["found"] > len(rows))
        return [job_from_row(row) for row in rows], more

    async def cancel(
        self,
        job_id: uuid.UUID,
        *,
        namespace: str | None = None,
        routing_keys: Sequence[str] | None = None,
    ) -> models.Job:
        """Cancel a scheduled job; JobStateConflict once it is claimed or done."""
        return await self._transition(
            job_reads.CANCEL_JOB, job_id, namespace, routing_keys, fenced=True
        )

    async def reschedule(
        self,
        job_id: uuid.UUID,
        change: models.JobChange,
        *,
        namespace: str | None = None,
        routing_keys: Sequence[str] | None = None,
    ) -> models.Job:
        """New time, payload or priority for a scheduled job; JobStateConflict once it is claimed
        (being published: it will be delivered) or done."""
        return await self._transition(
            job_reads.RESCHEDULE_JOB,
            job_id,
            namespace,
            routing_keys,
            change.run_at,
            change.payload,
            change.set_priority,
            change.priority,
            fenced=True,
        )

    async def requeue(
        self, job_id: uuid.UUID, *, shard: int, namespace: str | None = None
    ) -> models.Job:
        """A dead job back to ``scheduled``, due now on ``shard``; JobStateConflict otherwise."""
        return await self._transition(
            job_reads.REQUEUE_DEAD_JOB, job_id, namespace, None, shard, self._node_id
        )

    async def _transition(
        self,
        query: str,
        job_id: uuid.UUID,
        namespace: str | None,
        routing_keys: Sequence[str] | None,
        *args: object,
        fenced: bool = False,
    ) -> models.Job:
        """Run a state change that returns the row; say why when it changed nothing. ``fenced``:
        a change of a pending job, made behind its shard's fence (``job_reads.FENCE_JOB``, whose
        shard the query takes last), so that it reads the job after any claim of the shard under
        way has committed; a job moved to another shard between the two (a dead one requeued)
        is fenced again."""
        current: asyncpg.Record | None = None
        async with self._db.connection() as connection, connection.transaction():
            for _ in range(_FENCE_TRIES):
                fence = [await connection.fetchval(job_reads.FENCE_JOB, job_id)] if fenced else []
                row = await connection.fetchrow(
                    query, job_id, namespace, routing_keys, *args, *fence
                )
                if row is not None:
                    break
                current = await connection.fetchrow(
                    job_reads.SELECT_JOB, job_id, namespace, routing_keys
                )
                if current is None or not fence or current["shard"] == fence[0]:
                    break
        return _changed(row, current if row is None else None)

    async def prerequisites(self, job_id: uuid.UUID) -> list[tuple[uuid.UUID, bool]]:
        """(prerequisite, succeeded) for each job named in this job's ``after``, in order."""
        async with self._db.connection() as connection:
            return await dependencies.prerequisites(connection, job_id)

    async def by_idempotency_key(
        self,
        key: str,
        *,
        namespace: str | None = None,
        routing_keys: Sequence[str] | None = None,
    ) -> list[models.Job]:
        async with self._db.connection() as connection:
            rows = await connection.fetch(
                intake.SELECT_BY_IDEMPOTENCY_KEY, key, namespace, routing_keys
            )
        return [job_from_row(row) for row in rows]

    # --- scheduler ------------------------------------------------------------------------------

    async def load_due(
        self,
        shards: Sequence[int],
        *,
        after: tuple[datetime, uuid.UUID],
        until: datetime,
        limit: int,
        held: rules.HeldKeys = rules.NOTHING_HELD,
    ) -> tuple[list[models.DueEntry], tuple[datetime, uuid.UUID] | None]:
        """Due entries after the keyset cursor that no flow rule holds (``held``, as the look
        starts: a release after it looks again, ``Loader``), and the exact key of the last one."""
        async with self._db.connection(SCHEDULER_TIMEOUT_S) as connection:
            rows = await connection.fetch(
                scheduler.LOAD_DUE, list(shards), after[0], after[1], until, limit, *_arrays(held)
            )
        last = (rows[-1]["run_at"], rows[-1]["id"]) if rows else None
        return [entry_from_row(row) for row in rows], last

    async def expired_leases(
        self, shards: Sequence[int], limit: int, *, since: datetime = EVER
    ) -> tuple[list[models.DueEntry], datetime]:
        """Claims whose lease ran out at ``since`` or later (PostgreSQL's clock), in the order
        they ran out, and the time of the look by that clock."""
        async with self._db.connection(SCHEDULER_TIMEOUT_S) as connection:
            rows = await connection.fetch(scheduler.EXPIRED_LEASES, list(shards), limit, since)
        found = [entry_from_row(row) for row in rows if row["id"] is not None]
        return found, rows[0]["looked_at"]

    async def orphaned_claims(
        self, epochs: Mapping[int, int], limit: int, *, handover: models.Handover
    ) -> models.Orphans:
        """Claims of these shards made under an earlier epoch than the one given (held here):
        those ripe to fire again, and when the next of the others will be (``handover``)."""
        shards = list(epochs)
        # A lease longer than the grace: a live owner's claim is ripe this long before it ends.
        short_of_lease_s = self._lease_s - handover.grace_s
        async with self._db.connection(SCHEDULER_TIMEOUT_S) as connection:
            rows = await connection.fetch(
                scheduler.ORPHANED_CLAIMS,
                shards,
                [epochs[shard] for shard in shards],
                [handover.first_epochs.get(shard, epochs[shard]) for shard in shards],
                self._node_id,
                sorted(handover.members),
                short_of_lease_s,
                limit,
            )
        ripe = [entry_from_row(row) for row in rows if row["ripe_in_s"] <= 0]
        waits = [row["ripe_in_s"] for row in rows if row["ripe_in_s"] > 0]
        return models.Orphans(ripe, found=len(rows), next_ripe_in_s=min(waits, default=None))

    async def overdue_stragglers(
        self,
        shards: Sequence[int],
        grace_s: float,
        limit: int,
        *,
        held: rules.HeldKeys = rules.NOTHING_HELD,
    ) -> list[models.DueEntry]:
        async with self._db.connection(SCHEDULER_TIMEOUT_S) as connection:
            rows = await connection.fetch(
                scheduler.OVERDUE_STRAGGLERS, list(shards), grace_s, limit, *_arrays(held)
            )
        return [entry_from_row(row) for row in rows]

    async def claim(
        self,
        entries: Iterable[models.DueEntry],
        epochs: Mapping[int, int],
        *,
        ahead_s: float = 0.0,
        held: rules.HeldKeys = rules.NOTHING_HELD,
        granted: Collection[uuid.UUID] = (),
    ) -> models.Claim:
        """Claim the jobs of these entries under the given shard epochs, those PostgreSQL's clock
        says are due within ``ahead_s``; rows no longer claimable (fired, cancelled, rescheduled
        past the entry's time, shard moved), held by a flow rule (``held``) unless its meter let
        them go (``granted``), or not yet due are skipped. With the clock the claim read, which
        says when each may be published."""
        due: dict[uuid.UUID, float] = {}
        fenced: set[int] = set()
        keys: set[str] = set()
        grants = set(granted)
        for entry in entries:  # a job in two entries is due at the later one (a reschedule)
            due[entry.id] = max(entry.run_at_s, due.get(entry.id, entry.run_at_s))
            fenced.add(entry.shard)
            if entry.id not in grants:
                keys.add(entry.key)
        # Only the epochs of the batch's shards are locked: each lock writes its row (a few dozen
        # a batch, not every shard held); a job no longer on its entry's shard is skipped.
        shards = sorted(fenced.intersection(epochs))
        # In id order, as every statement that locks several jobs takes them (``= ANY`` walks the
        # index in order): two claims of one job (a re-fired claim also due in the heap) or a
        # claim beside a confirm's mark wait for each other instead of deadlocking.
        ids = sorted(due)
        if held and not any(held.may_hold(key) for key in keys):
            held = rules.NOTHING_HELD  # no rule matches these keys: the claim need not ask
        async with self._db.connection(SCHEDULER_TIMEOUT_S) as connection:
            rows = await connection.fetch(
                scheduler.CLAIM_JOBS,
                ids,
                shards,
                [epochs[shard] for shard in shards],
                self._node_id,
                self._lease_s,
                [due[job_id] for job_id in ids],
                ahead_s,
                *_arrays(held),
                list(grants),
            )
        jobs = [claimed_from_row(row) for row in rows if row[_CLAIM_CLOCKS] is not None]
        return models.Claim(jobs, fenced_at_s=rows[0][0], answered_at_s=rows[0][1])

    async def park(self, jobs: Sequence[tuple[uuid.UUID, str]]) -> list[models.Parked]:
        """Dead with these reasons (jobs no longer scheduled or claimed are left alone)."""
        if not jobs:
            return []
        ids, reasons = ([job_id for job_id, _ in jobs], [reason for _, reason in jobs])
        async with self._db.connection(SCHEDULER_TIMEOUT_S) as connection:
            rows = await connection.fetch(scheduler.PARK_JOBS, ids, reasons, self._node_id)
        return [models.Parked(row["id"], row["routing_key"]) for row in rows]

    async def mark_dispatched(self, ids: Iterable[uuid.UUID]) -> None:
        """Dispatched, those still in flight: a job its consumer settled already stays as it is
        (see ``scheduler.MARK_DISPATCHED``)."""
        marked = sorted(ids)  # in id order: see ``claim``
        if not marked:
            return
        async with self._db.connection(SCHEDULER_TIMEOUT_S) as connection:
            await connection.execute(scheduler.MARK_DISPATCHED, marked)

    async def mark_expired(self, ids: Iterable[uuid.UUID]) -> None:
        await self._update(scheduler.MARK_EXPIRED, list(ids))

    async def release(self, ids: Iterable[uuid.UUID], *, announce: bool = False) -> None:
        """Give claims back (scheduled again); ``announce`` them when their shard moved away."""
        query = scheduler.RELEASE_CLAIMS_ANNOUNCED if announce else scheduler.RELEASE_CLAIMS
        await self._update(query, list(ids), self._node_id)

    async def _update(self, query: str, ids: list[uuid.UUID], *args: object) -> None:
        if not ids:
            return
        async with self._db.connection(SCHEDULER_TIMEOUT_S) as connection:
            await connection.execute(query, ids, *args)


def _changed(row: asyncpg.Record | None, current: asyncpg.Record | None) -> models.Job:
    """The job a change returned; or why it changed nothing: no such job (for this caller), or
    the state it is in."""
    if row is not None:
        return job_from_row(row)
    if current is None:
        raise errors.JobNotFound()
    raise errors.JobStateConflict(current["state"])


class _Answer(NamedTuple):
    """What the insert did with one job: the id of the job it answers with (the new one, or the
    one its key names), and its created_at."""

    id: uuid.UUID
    created_at: datetime
    outcome: models.Outcome

    @property
    def created(self) -> bool:
        return self.outcome is models.Outcome.CREATED


async def _rows(
    connection: asyncpg.pool.PoolConnectionProxy, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, models.Job]:
    if not ids:
        return {}
    return {
        row["id"]: job_from_row(row)
        for row in await connection.fetch(intake.SELECT_JOBS, list(ids))
    }


def as_stored(
    job: models.NewJob, created_at: datetime, state: models.JobState = models.JobState.SCHEDULED
) -> models.Job:
    """The row just inserted, as the database holds it (the column defaults of ENQUEUE_JOBS)."""
    spec = job.spec
    return models.Job(
        id=job.id,
        shard=job.shard,
        state=state,
        routing_key=spec.routing_key,
        payload=spec.payload,
        run_at=spec.run_at,
        idempotency_key=spec.idempotency_key,
        headers=spec.headers,
        priority=spec.priority,
        ttl_ms=spec.ttl_ms,
        created_at=created_at,
        updated_at=created_at,
        dispatched_at=None,
        publish_attempts=0,
        namespace=job.namespace,
        release_key=spec.release_key,
    )


# Each inserted column's parameter, as a path into ``NewJob``; read in the order of
# ``intake.INSERTED_COLUMNS`` by getters built here (a column missing fails at import).
_PARAMETER_PATHS: Final = {
    "id": "id",
    "shard": "shard",
    "routing_key": "spec.routing_key",
    "payload": "spec.payload",
    "headers": "spec.headers",  # sent as JSON text
    "priority": "spec.priority",
    "ttl_ms": "spec.ttl_ms",
    "idempotency_key": "spec.idempotency_key",
    "run_at": "spec.run_at",
    "namespace": "namespace",
}
_PATHS_IN_ORDER: Final = [_PARAMETER_PATHS[name] for name, _ in intake.INSERTED_COLUMNS]
_PARAMETERS: Final = [operator.attrgetter(path) for path in _PATHS_IN_ORDER]  # one per column
_ALL_PARAMETERS: Final = operator.attrgetter(*_PATHS_IN_ORDER)  # a job's, in one call
_HEADERS_PARAMETER: Final = [name for name, _ in intake.INSERTED_COLUMNS].index("headers")


def single_insert(job: models.NewJob) -> str:
    """The plain insert for one job: with ON CONFLICT only when it has a key to conflict on."""
    return intake.INSERT_JOB if job.spec.idempotency_key is None else intake.INSERT_KEYED_JOB


def insert_values(job: models.NewJob) -> list[object]:
    """A job's parameters of INSERT_JOB, in the order of ``intake.INSERTED_COLUMNS``."""
    values: list[object] = list(_ALL_PARAMETERS(job))
    values[_HEADERS_PARAMETER] = _json_text(job.spec.headers)
    return values


def insert_arrays(jobs: Sequence[models.NewJob]) -> list[list[object]]:
    """The parameters of ENQUEUE_JOBS: each of ``insert_values`` as an array over ``jobs``."""
    # Column by column: one C getter mapped over the batch for each.
    arrays = [list(map(parameter, jobs)) for parameter in _PARAMETERS]
    arrays[_HEADERS_PARAMETER] = list(map(_json_text, arrays[_HEADERS_PARAMETER]))
    return arrays


def _json_text(headers: Mapping[str, models.HeaderValue]) -> str:
    return orjson.dumps(dict(headers)).decode()


def _arrays(held: rules.HeldKeys) -> tuple[str, list[str]]:
    """The parameters of ``shared.not_held``."""
    return held.rules_json, held.first_words
