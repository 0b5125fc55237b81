"""Domain records and enums. Frozen, no I/O; built from rows (``store``) and requests (``api``).

Job states and their transitions (the database enforces the set, ``store`` the transitions):

    scheduled   --claim-->        dispatching   (fenced by the shard's epoch, leased)
    dispatching --confirm-->      dispatched    (RabbitMQ confirmed the publish)
    dispatching --publish fails-> scheduled     (released; or re-claimed once the lease runs out)
    dispatching --ttl passed-->   expired       (never published)
    scheduled   --DELETE-->       cancelled     (never published)
    dispatched  --consumer event--> succeeded | dead   (reported by the SDK, see ``events``)
    dead        --requeue-->      scheduled     (due now, a new dispatch round; history kept)
    waiting     --each prerequisite succeeded-->  scheduled   (run_at kept; see ``dependencies``)
    waiting     --a prerequisite dead, cancelled or expired; DELETE--> cancelled

A job submitted with ``after`` starts ``waiting`` unless every job it names has succeeded
already; the moves out of ``waiting`` are made by the database (``sql/0006_dependencies.sql``) in
the transaction of the prerequisite's own change.

Each dispatch has a round (``dispatch_round``, renewed by a requeue): only events that echo the
job's round and name its routing key count. Consumer events may arrive before the confirm is
marked: they never move a job in ``dispatching``, whose confirm takes the latest final outcome
already reported for its round instead. A later final event (a job taken back from .dead and
succeeding) wins.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

# UUIDv7 job ids, defined in the SDK so that its ``enqueue`` makes the same kind.

ShardId = int
HeaderValue = str | int | float | bool


class JobState(StrEnum):
    SCHEDULED = "scheduled"
    DISPATCHING = "dispatching"
    DISPATCHED = "dispatched"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    WAITING = "waiting"  # for the jobs named in its ``after``


# Out of the scheduler's hands (published, settled or never to be): retention deletes such a job
# once old. ``DELETE_FINISHED`` spells this set in SQL; a test holds it equal to this one.
FINISHED_STATES = frozenset(
    {JobState.DISPATCHED, JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED, JobState.EXPIRED}
)


class OnExisting(StrEnum):
    """What a submit does when its idempotency key names a job already."""

    KEEP = "keep"  # nothing: the answer is that job
    REPLACE = "replace"  # the pending job takes the new run_at, payload, headers, priority, ttl
    EXTEND = "extend"  # the pending job moves to the new run_at if later (a debounce)


class KeyRelease(StrEnum):
    """When a job lets go of its idempotency key, so that the next submit of it creates a job."""

    NEVER = "never"  # as long as its row lives
    DISPATCHED = "dispatched"  # once handed to RabbitMQ, or ended otherwise
    FINISHED = "finished"  # once succeeded, dead, cancelled or expired


class Outcome(StrEnum):
    """What a submit did (``dispatcher_enqueue_v2``'s outcomes)."""

    CREATED = "created"
    KEPT = "kept"  # the job the key names, unchanged
    REPLACED = "replaced"
    EXTENDED = "extended"
    REFUSED = "refused"  # replace or extend asked, and that job is no longer pending


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """A validated request: what to publish, where and when. Intake adds the id and the shard."""

    routing_key: str
    payload: bytes  # the JSON body exactly as published
    run_at: datetime
    idempotency_key: str | None = None
    headers: Mapping[str, HeaderValue]
    priority: int | None = None
    ttl_ms: int | None = None
    after: tuple[uuid.UUID, ...] = ()  # jobs that must succeed first
    on_existing: OnExisting = OnExisting.KEEP
    release_key: KeyRelease = KeyRelease.NEVER

    @property
    def keyed(self) -> bool:
        """Whether it asks more of its idempotency key than today's keep-forever."""
        return self.on_existing is not OnExisting.KEEP or self.release_key is not KeyRelease.NEVER


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """A validated job about to be stored: its spec, with the id and the shard intake chose."""

    id: uuid.UUID
    shard: ShardId
    spec: JobSpec
    namespace: str | None = None  # None: the default namespace
    # The words of the submitting key's routing-key prefixes (None: any): a job outside them is
    # neither handed back under an idempotency key nor waited for (``after``).
    routing_scope: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A stored job."""

    id: uuid.UUID
    shard: ShardId
    state: JobState
    routing_key: str
    payload: bytes
    run_at: datetime
    idempotency_key: str | None
    headers: Mapping[str, HeaderValue]
    priority: int | None
    ttl_ms: int | None
    created_at: datetime
    updated_at: datetime
    dispatched_at: datetime | None
    publish_attempts: int
    namespace: str | None = None  # None: the default namespace
    last_error: str | None = None  # a dead job's error, as its consumer reported it
    release_key: KeyRelease = KeyRelease.NEVER
    key_released: bool = False  # it let go of ``idempotency_key``: another job may hold it now


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job claimed for firing: what its message is made of, and its namespace (``CLAIM_JOBS``
    returns these columns in this order, and no others: firing decodes nothing it does not use)."""

    id: uuid.UUID
    shard: ShardId
    routing_key: str
    payload: bytes
    run_at: datetime
    idempotency_key: str | None
    headers: Mapping[str, HeaderValue]
    priority: int | None
    ttl_ms: int | None
    dispatch_round: uuid.UUID  # sent as ``x-dispatcher-round``; consumers' events echo it
    namespace: str | None = None  # not published: which flow rules governed it (its lateness)

    @property
    def expires_at(self) -> datetime | None:
        """Past this instant the job is expired instead of published."""
        if self.ttl_ms is None:
            return None
        try:  # rows stored before the bounds (or by hand) may reach past year 9999
            return self.run_at + timedelta(milliseconds=self.ttl_ms)
        except OverflowError:
            return None


class Claim(NamedTuple):
    """What one claim statement took, and PostgreSQL's clock (POSIX seconds) when it fenced the
    jobs and when it answered: a job is published no earlier than that last reading says it is
    due."""

    jobs: list[Claimed]
    fenced_at_s: float
    answered_at_s: float


class Parked(NamedTuple):
    """A job taken out of firing as dead (``last_error`` says why)."""

    id: uuid.UUID
    routing_key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobChange:
    """A validated reschedule: what to change on a job still waiting to fire (None: keep)."""

    run_at: datetime | None = None
    payload: bytes | None = None
    set_priority: bool = False
    priority: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEvent:
    """One step of a job's life after its publish (``consumers_sdk.contract.JobEvent``), or a
    change the dispatcher made (a requeue, a replace or extend), as recorded."""

    outcome: str
    attempt: int
    group: str
    consumer: str
    error: str | None
    at: datetime
    ignored: str | None = None  # why it changed nothing (another dispatch round...); None: counted
    detail: str | None = None  # what the dispatcher's change did (the new time...)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobHistory:
    """A job's recorded events, and how many more ignored ones were counted but not kept (a job
    keeps a few: ``history.IGNORED_KEPT``)."""

    events: tuple[JobEvent, ...]
    ignored_dropped: int = 0
    events_omitted: int = 0  # older reported events left out of a bounded history


@dataclass(frozen=True, slots=True, kw_only=True)
class Submitted:
    """The answer to one submission: the job, and whether this request created it."""

    job: Job
    outcome: Outcome

    @property
    def created(self) -> bool:
        return self.outcome is Outcome.CREATED


class DueEntry(NamedTuple):
    """What the scheduler keeps of a job: enough to order it, to claim it and to take turns
    between routing keys (about 200 B; the key string is shared, see ``routing_key_of``).

    Ordered by time, then by ``rank``: of two jobs due at the same instant, the one of higher
    priority comes first. Build one with keywords (``DueEntry.make``): the fields' order is the
    order of comparison."""

    run_at_s: float  # POSIX seconds
    rank: int  # minus the job's priority (0 without one): lower comes first
    id: uuid.UUID
    shard: ShardId
    key: str = ""  # the routing key; "" when unknown (a due notice), which only affects turns

    @property
    def priority(self) -> int:
        return -self.rank

    @classmethod
    def make(
        cls,
        run_at_s: float,
        id: uuid.UUID,
        shard: ShardId,
        key: str = "",
        priority: int | None = None,
    ) -> DueEntry:
        return cls(run_at_s, -(priority or 0), id, shard, key)

    @classmethod
    def of(cls, job: Job | Claimed) -> DueEntry:
        return cls.make(
            job.run_at.timestamp(), job.id, job.shard, routing_key_of(job.routing_key), job.priority
        )


@dataclass(frozen=True, slots=True)
class Handover:
    """Who may still settle claims a previous epoch of a shard made, and for how long.

    A claim is published before it is marked: the node that made it, if alive, confirms and
    marks it (or releases it) after its shard moved on. Its claims are taken over only once it
    had ``grace_s`` since each was made; a dead owner's at once."""

    members: frozenset[str]  # the nodes in the cluster now (this one included)
    first_epochs: Mapping[ShardId, int]  # shard -> the first epoch this process took it under
    grace_s: float


@dataclass(frozen=True, slots=True)
class Orphans:
    """What a look for a previous epoch's claims found."""

    ripe: list[DueEntry]  # to fire again now
    found: int  # rows read, ripe or not (the look's limit applies to them)
    next_ripe_in_s: float | None  # when the next of the others is ripe; None: none wait


def routing_key_of(routing_key: str) -> str:
    """One string object per routing key in memory, however many entries name it."""
    return sys.intern(routing_key)
