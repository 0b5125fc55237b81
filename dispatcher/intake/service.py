"""Intake: gives validated jobs an id and a shard, stores them, and offers the ones due soon to the
scheduler, so they fire without waiting for a load."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Sequence
from typing import Protocol

from consumers_sdk import ids
from dispatcher import metrics, models
from dispatcher.cluster import ownership
from dispatcher.intake.group_commit import GroupCommit
from dispatcher.store.jobs import JobStore
from dispatcher.timing.kinds import NodeTime

# A batch's per-job work runs in chunks of this many, handing the loop back in between: a batch
# of 1000 done at once held up firing for tens of milliseconds (the lateness benchmark's p99).
YIELD_EVERY = 100


async def take_turn(index: int) -> None:
    """Called with each job's index in a batch: hands the loop back every ``YIELD_EVERY`` jobs."""
    if index and index % YIELD_EVERY == 0:
        await asyncio.sleep(0)  # jobs falling due meanwhile are fired between chunks


class LoadedWindow(Protocol):
    """The jobs this node holds in memory to fire (``firing.loader.Loader``): intake offers it
    every scheduled job it stored."""

    def offer(self, entries: Iterable[models.DueEntry]) -> None:
        """Keep the entries no load will pick up (inside the loaded window); ignore the others."""


def repeated_key(keys: Sequence[str | None]) -> tuple[int, int] | None:
    """(index, index of its first occurrence) of the first idempotency key a batch names twice,
    else None: a batch may not name one key twice (None, no key, may repeat)."""
    seen: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key is None:
            continue
        if key in seen:
            return index, seen[key]
        seen[key] = index
    return None


class Intake:
    def __init__(
        self,
        *,
        store: JobStore,
        window: LoadedWindow,
        ownership: ownership.Ownership,
        metrics: metrics.Metrics,
        shard_count: int,
        lookahead_s: float,
        group_commit: bool = True,
        now: NodeTime,
    ) -> None:
        self._store = store
        self._window = window
        self._ownership = ownership
        self._metrics = metrics
        self._all_shards = list(range(shard_count))
        self._lookahead_s = lookahead_s
        self._now = now
        self._ids = ids.JobIds()
        self.group_commit = GroupCommit(store.insert, max_batch=500, flushers=4)
        self._grouped = group_commit

    async def run(self) -> None:
        await self.group_commit.run()

    async def submit(
        self,
        specs: Sequence[models.JobSpec],
        *,
        namespace: str | None = None,
        routing_scope: Sequence[str] | None = None,
    ) -> list[models.Submitted]:
        """Store all or nothing, in ``namespace`` (None: the default one), for a key whose
        prefixes name the words ``routing_scope`` (None: any); a 2xx may be answered once this
        returns. IdempotencyKeyTaken when a key names a job outside that scope.

        A single job joins a group commit with other concurrent single submissions."""
        scope = tuple(routing_scope) if routing_scope is not None else None
        window_end_s = self._now() + self._lookahead_s
        owned = list(self._ownership.epochs())
        new_jobs = []
        for index, spec in enumerate(specs):
            await take_turn(index)
            job_id = self._ids.next()
            # Due soon: a shard this node owns, so it fires from here without a load.
            due_soon = owned and spec.run_at.timestamp() <= window_end_s
            shard = ids.shard_for(job_id.bytes, owned if due_soon else self._all_shards)
            new_jobs.append(
                models.NewJob(
                    id=job_id, shard=shard, spec=spec, namespace=namespace, routing_scope=scope
                )
            )
        # A job with prerequisites is refused on its own (422), so it never shares a group commit;
        # nor does one that replaces, extends or lets go of its key: two submits of one key in a
        # group would be one statement's two changes of one row; nor one whose key may name a job
        # outside its key's prefixes, refused alone (a group would be retried job by job).
        first = new_jobs[0].spec if new_jobs else None
        single = (
            first is not None
            and len(new_jobs) == 1
            and not (first.after or first.keyed)
            and not (scope is not None and first.idempotency_key)
        )
        if single and self._grouped:
            results = [await self.group_commit.submit(new_jobs[0])]
        else:
            results = await self._store.insert(new_jobs)
        created = [result.job for result in results if result.created]
        scheduled = [  # a waiting one is released by the database
            models.DueEntry.of(job) for job in created if job.state is models.JobState.SCHEDULED
        ]
        for start in range(0, len(scheduled), YIELD_EVERY):
            if start:
                await asyncio.sleep(0)
            self._window.offer(scheduled[start : start + YIELD_EVERY])
        self._metrics.count_by_key(self._metrics.jobs_submitted, created)
        return results

    async def requeue(self, job_id: uuid.UUID, *, namespace: str | None = None) -> models.Job:
        """A dead job back to ``scheduled``, due now, moved to a shard this node owns so that it
        fires from here without waiting for a load (JobStateConflict unless it is dead)."""
        owned = list(self._ownership.epochs()) or self._all_shards
        job = await self._store.requeue(
            job_id, shard=ids.shard_for(job_id.bytes, owned), namespace=namespace
        )
        self._window.offer([models.DueEntry.of(job)])
        return job
