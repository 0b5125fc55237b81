"""Firing: due entries -> fenced claim -> publish with confirms -> mark dispatched.

Several workers run the same loop so that one batch is being claimed while others wait for their
confirms: the broker's confirm path, not a round trip, bounds the rate. Confirmed jobs are marked
``dispatched`` by one task in shared round trips (``marks.py``). A claim is made before the
publish because a publish cannot be fenced; a claim whose publish is never confirmed is released,
or its lease runs out and the loader hands it back (at-least-once, never lost).

The workers take their batches from the due lanes (``lanes.Lanes``), which decide what a batch
holds. A claim is made ahead: once the earliest job is ``lanes.CLAIM_LEAD_S`` from due, the jobs
due in the next ``lanes.CLAIM_AHEAD_S`` are claimed in the same statement and each is published
when it is due, never before. The claim's round trip is then off the path from due to
published, and at a steady rate one statement serves tens of jobs instead of two or three.

Never early, whatever this node's clock. A claimed job is published once either of two clocks
says it is due, each carried on the monotonic clock: the node's time (PostgreSQL's clock,
measured: ``timekeeper``) as the claim was sent, less that measurement's error; or the claim's own
reading of PostgreSQL's clock, from when its answer was read (late by the round trip and any
event-loop delay, so the fallback). The claim takes only jobs due within ``CLAIM_FENCE_S`` of
that reading, and the node's time is not believed when, as the claim was sent, it was ahead of
the reading by more than ``fence.CLOCK_CHECK_S`` beyond its error, or it moved otherwise than the
monotonic clock while the claim ran. A job the fence refused is put back, counted and logged;
after either, the node measures PostgreSQL's clock again.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
import uuid
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from dispatcher import errors, metrics, models, supervision
from dispatcher.amqp.publisher import Publisher
from dispatcher.cluster.ownership import Ownership
from dispatcher.firing import fence, lanes
from dispatcher.firing.admission import OPEN, Admission
from dispatcher.firing.marks import DispatchMarks
from dispatcher.firing.quarantine import Quarantine
from dispatcher.store.jobs import JobStore
from dispatcher.timing.kinds import Mono, NodeClock

logger = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.2  # a worker's pause after a failed batch, doubling up to the next
MAX_BACKOFF_S = 5.0
BATCHES = "batches"  # what /readyz names while batches fail
# The claim's clock fence: how far before its run_at (by PostgreSQL's clock) a job may be claimed.
# What this node claims ahead, and 5 ms for its own time being off (its estimate's error is half a
# round trip, under a millisecond here): a job is still published no earlier than its run_at.
CLAIM_FENCE_S = lanes.CLAIM_LEAD_S + lanes.CLAIM_AHEAD_S + 0.005
FENCED_PAUSE_S = 0.05


@dataclass(frozen=True, slots=True)
class Publishers:
    """The live worker publishes on a connection of its own: on the shared one its jobs would
    queue behind the backlog batches in flight (one socket, one reader at the broker)."""

    shared: Publisher
    live: Publisher


class Firer:
    def __init__(
        self,
        *,
        store: JobStore,
        publishers: Publishers,
        ownership: Ownership,
        due_lanes: lanes.Lanes,
        metrics: metrics.Metrics,
        batch: int,
        workers: int,
        timekeeper: NodeClock,
        mono: Mono = time.monotonic,
        admission: Admission = OPEN,
    ) -> None:
        """``admission``: what flow control holds back, and lets go (``admission``)."""
        self._store = store
        self._publishers = publishers
        self._ownership = ownership
        self._lanes = due_lanes
        self._metrics = metrics
        self._batch = batch
        self._workers = workers
        self._timekeeper = timekeeper
        self._now = timekeeper.now  # bound once: read for every batch
        self._mono = mono
        self._admission = admission
        self._stop = asyncio.Event()
        self._marks = DispatchMarks(store.mark_dispatched)
        self._quarantine = Quarantine()
        self._confirmed = 0  # publishes confirmed, ever: evidence that a failure is a job's own
        self._failing = False  # a batch failed and none fired since: reported as ``BATCHES``
        # When (monotonic) a claim last came back and a publish was last confirmed: /readyz.
        self.claimed_at: float | None = None
        self.confirmed_at: float | None = None

    async def run(self) -> None:
        """Run the workers until ``stop``; returns once every batch in flight has settled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._marks.run(), name="fire-marks")
            workers = []
            for number in range(self._workers):
                # Worker 0 fires only jobs falling due now, so none waits behind a backlog batch.
                live_only = number == 0 and self._workers > 1
                workers.append(
                    group.create_task(self._work(live_only), name=f"fire-worker-{number}")
                )
            await asyncio.wait(workers)
            self._marks.close()  # the marks task ends once every confirmed job is marked

    def stop(self) -> None:
        """Drain: waiting workers stop now, busy ones after their batch is confirmed or released."""
        self._stop.set()

    async def _work(self, live_only: bool) -> None:
        """Fire batches until stopped. A failed batch pauses this worker, which retries here
        (raising would end the whole firer, marks included), and shows firing degraded until a
        batch of any worker fires (a worker may find no more work to prove itself with)."""
        publisher = self._publishers.live if live_only else self._publishers.shared
        backoff = supervision.Backoff(first_s=FIRST_BACKOFF_S, max_s=MAX_BACKOFF_S)
        while (entries := await self._take(live_only, publisher)) is not None:
            try:
                if await self._fire(entries, publisher):
                    backoff.reset()
                    if self._failing:
                        self._failing = False
                        supervision.report_recovered(BATCHES)
                    continue
                reason: Exception = RuntimeError("a batch failed unexpectedly (logged above)")
            except errors.StoreUnavailable as exc:
                self._lanes.put_back(entries)  # unclaimed, or claimed and leased: either is safe
                reason = exc
            except errors.PublishFailed as exc:
                reason = exc  # _fire already released and put back what was not confirmed
            delay = backoff.next()
            self._failing = True
            supervision.report_degraded(BATCHES, reason)
            logger.warning("firing paused %.1fs: %s", delay, reason, extra={"action": "fire"})
            await asyncio.sleep(delay)

    async def _unless_stopped(
        self, waiting: Awaitable[object], wait_s: float | None = None
    ) -> bool:
        """Wait for ``waiting`` (or the timeout); False as soon as the firer is told to stop."""
        waiter = asyncio.ensure_future(waiting)
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({waiter, stopper}, timeout=wait_s, return_when=FIRST_COMPLETED)
        finally:
            waiter.cancel()
            stopper.cancel()
        return not self._stop.is_set()

    async def _take(self, live_only: bool, publisher: Publisher) -> list[models.DueEntry] | None:
        """Wait until jobs are due, the broker is there and this node may fire; take a batch.

        None once the firer is stopping.
        """
        while not self._stop.is_set():
            if not publisher.is_ready() and not await self._unless_stopped(publisher.wait_ready()):
                return None
            if not self._ownership.can_fire() and not await self._unless_stopped(
                self._ownership.wait_can_fire()
            ):
                return None
            if not self._timekeeper.trusted() and not await self._unless_stopped(
                self._timekeeper.wait_trusted()
            ):
                return None
            entries = self._lanes.take(self._now(), self._batch, live_only=live_only)
            if entries:
                return entries
            timeout = self._lanes.next_wake_s(self._now(), live_only=live_only)
            self._lanes.due.clear()
            await self._unless_stopped(self._lanes.due.wait(), timeout)
        return None

    async def _fire(self, entries: list[models.DueEntry], publisher: Publisher) -> bool:
        """Fire a batch, the suspects among it (see ``quarantine``) each alone; whether every part
        went without an unexpected failure (False: the worker backs off)."""
        clean = True
        if len(self._quarantine):
            suspects = [entry for entry in entries if entry.id in self._quarantine]
            if suspects:
                entries = [entry for entry in entries if entry.id not in self._quarantine]
                for entry in suspects:
                    clean = await self._fire_isolated([entry], publisher) and clean
        if entries:
            clean = await self._fire_isolated(entries, publisher) and clean
        return clean

    async def _fire_isolated(self, entries: list[models.DueEntry], publisher: Publisher) -> bool:
        """``_fire_batch``; a failure that is not a service being away is held against the batch's
        jobs, not the firing loop. False when that happened."""
        try:
            await self._fire_batch(entries, publisher)
        except errors.TRANSIENT:
            raise
        except Exception as exc:
            logger.exception(
                "firing %d jobs failed; firing them alone", len(entries), extra={"action": "fire"}
            )
            await self._strike(entries, f"firing failed: {exc!r}", progress=self._confirmed)
            return False
        return True

    async def _strike(
        self, entries: list[models.DueEntry], reason: str, *, progress: int | None = None
    ) -> None:
        """A failure of these jobs together: alone, one strike (parked at the last); several,
        each becomes a suspect, fired alone from then on.

        A nack always strikes; an unexpected failure (``progress`` given) only when other jobs
        were confirmed since the job's previous strike: while everything fails (a bug or a fault
        that is not the job's), nothing is parked."""
        if len(entries) == 1:
            await self._strike_each(entries, reason, progress=progress)
            return
        self._quarantine.suspect(entry.id for entry in entries)
        await self._retry_later(entries)

    async def _strike_each(
        self, entries: list[models.DueEntry], reason: str, *, progress: int | None = None
    ) -> None:
        """Each of these jobs failed on its own (a nack, or a suspect fired alone): a strike
        each; those at the last are parked, the others tried again later, in one round trip
        each."""
        last = [
            entry
            for entry in entries
            if self._quarantine.strike(entry.id, reason, progress=progress)
        ]
        if last:
            await self._park([(entry.id, reason) for entry in last])
        parked = {entry.id for entry in last}
        await self._retry_later([entry for entry in entries if entry.id not in parked])

    async def _retry_later(self, entries: list[models.DueEntry]) -> None:
        """Release the claims and fire again, a struck job after its quarantine delay."""
        if not entries:
            return
        await self._store.release(entry.id for entry in entries)
        now_s = self._now()
        self._lanes.put_back(
            entry._replace(run_at_s=max(entry.run_at_s, now_s + self._quarantine.delay_s(entry.id)))
            for entry in entries
        )

    async def _park(self, jobs: list[tuple[uuid.UUID, str]]) -> None:
        """Dead, with the reason: never retried by firing again (a requeue may try once more)."""
        parked = await self._store.park(jobs)
        self._quarantine.clear(job_id for job_id, _ in jobs)
        self._metrics.count_by_key(self._metrics.jobs_parked, parked)
        for job_id, reason in jobs:
            logger.error(
                "job %s parked as dead: %s",
                job_id,
                reason,
                extra={"action": "park", "job_id": str(job_id)},
            )

    async def _fire_batch(self, entries: list[models.DueEntry], publisher: Publisher) -> None:
        """Claim the batch in one statement, then publish each claimed job once it is due: by the
        node's time, or, should that have run ahead, by the claim's own reading of the clock."""
        held = self._ownership.epochs()
        mine = [entry for entry in entries if entry.shard in held]
        if not mine:
            return
        epochs = {entry.shard: held[entry.shard] for entry in mine}
        sent_s, sent_mono = self._now(), self._mono()
        claim = await self._store.claim(
            mine,
            epochs,
            ahead_s=CLAIM_FENCE_S,
            held=self._admission.held(),
            granted=self._admission.granted(entry.id for entry in mine),
        )
        read_s, read_mono = self._now(), self._mono()  # after PostgreSQL read its clock
        self._metrics.claims.inc()
        self.claimed_at = read_mono
        fenced = self._fenced(mine, claim)
        # Those due already go in the order the lanes gave them (a catch-up's priorities, the
        # turns of its keys); those claimed ahead, each at its time.
        place = {entry.id: n for n, entry in enumerate(mine)}
        fenced_at = datetime.fromtimestamp(claim.fenced_at_s, UTC)
        claimed = sorted(
            claim.jobs, key=lambda job: (max(job.run_at, fenced_at), place.get(job.id, 0))
        )
        # When each may go, on the monotonic clock: by the node's time or the claim's reading of
        # PostgreSQL's clock, whichever is believed and sooner (``fence``), in the order above.
        readings = fence.Readings(
            sent_s=sent_s,
            sent_mono=sent_mono,
            read_s=read_s,
            read_mono=read_mono,
            answered_at_s=claim.answered_at_s,
            error_s=self._timekeeper.error_s(),
        )
        due_mono = fence.due_mono([job.run_at.timestamp() for job in claimed], readings)
        believed = readings.believed
        if not believed:
            logger.warning(
                "this node's time was %.3f s ahead of PostgreSQL's clock as the claim read it "
                "(beyond its error), and moved %.3f s against the monotonic clock meanwhile: "
                "%d jobs published by that reading",
                readings.ahead_s,
                readings.moved_s,
                len(claimed),
                extra={"action": "fence"},
            )
        published = 0  # claimed[:published] are handed to _publish_claimed
        try:
            while published < len(claimed):
                now_mono = self._mono()
                due = bisect.bisect_right(due_mono, now_mono, lo=published)
                if due == published:
                    await asyncio.sleep(due_mono[published] - now_mono)
                    continue
                group, published = claimed[published:due], due
                await self._publish_claimed(group, epochs, publisher)
        except Exception:
            if published < len(claimed):  # claimed ahead, not yet published: released, or leased
                with contextlib.suppress(*errors.TRANSIENT):
                    await self._give_back(claimed[published:])
            raise
        if fenced or not believed:
            await self._timekeeper.resync()
            # Should the node's time still be ahead, its next claims would be fenced as fast as
            # they go round: a pause bounds that (only ever after a clock stepped under the node).
            await asyncio.sleep(FENCED_PAUSE_S)

    def _fenced(self, entries: list[models.DueEntry], claim: models.Claim) -> bool:
        """Whether the claim's clock fence refused entries (not due by PostgreSQL's clock): those
        are put back, counted and logged. Entries refused for another reason (fired, cancelled,
        moved) are dropped, as before."""
        # A millisecond short of the fence: a float here and a timestamp there may round apart,
        # and an entry dropped by mistake would wait for the sweep.
        limit_s = claim.fenced_at_s + CLAIM_FENCE_S - 0.001
        taken = {job.id for job in claim.jobs}
        early = [e for e in entries if e.id not in taken and e.run_at_s > limit_s]
        if not early:
            return False
        self._metrics.claims_fenced.inc(len(early))
        ahead_s = max(entry.run_at_s for entry in early) - claim.fenced_at_s
        logger.warning(
            "the claim's clock fence refused %d jobs not yet due by PostgreSQL's clock (up to "
            "%.3f s early; this node's time says %.3f s past PostgreSQL's): put back",
            len(early),
            ahead_s,
            self._now() - claim.answered_at_s,
            extra={"action": "fence"},
        )
        self._lanes.put_back(early)
        return True

    async def _publish_claimed(
        self, claimed: list[models.Claimed], epochs: Mapping[int, int], publisher: Publisher
    ) -> None:
        """Publish claimed jobs that are due: expired ones marked, ones whose shard moved since
        the claim handed to its new owner, the rest published and their outcomes settled."""
        held = self._ownership.epochs()
        moved = [job for job in claimed if held.get(job.shard) != epochs[job.shard]]
        if moved:
            await self._store.release((job.id for job in moved), announce=True)
            claimed = [job for job in claimed if held.get(job.shard) == epochs[job.shard]]
        now = datetime.fromtimestamp(self._now(), UTC)
        expired: list[models.Claimed] = []
        live: list[models.Claimed] = []
        for job in claimed:
            expires_at = job.expires_at
            if expires_at is not None and expires_at <= now:
                expired.append(job)
            else:
                live.append(job)
        if expired:
            await self._store.mark_expired(job.id for job in expired)
            self._metrics.count_by_key(self._metrics.jobs_expired, expired)
        if not live:
            return
        if not self._ownership.can_fire():
            # Self-fenced between claim and publish (ownership in doubt): give the claims back.
            await self._store.release(job.id for job in live)
            self._lanes.put_back(_entries(live))
            return
        outcome = await publisher.publish_many(live)
        if outcome.confirmed:
            self._confirmed += len(outcome.confirmed)
            self.confirmed_at = self._mono()
            self._marks.add(job.id for job in outcome.confirmed)
            self._observe(outcome.confirmed)
            if len(self._quarantine):
                self._quarantine.clear(job.id for job in outcome.confirmed)
        if outcome.unpublishable:  # the same job would fail the same way every time
            await self._park([(job.id, reason) for job, reason in outcome.unpublishable])
        if outcome.nacked:
            await self._strike_each(_entries(outcome.nacked), "RabbitMQ refused the message (nack)")
        if outcome.failed:
            await self._give_back(outcome.failed)
            raise errors.PublishFailed(
                f"{len(outcome.failed)} of {len(live)} publishes not confirmed"
            )

    async def _give_back(self, jobs: list[models.Claimed]) -> None:
        """Release claims that were not confirmed: back in memory to fire again, or, for a shard
        that moved meanwhile, announced to its new owner."""
        held = self._ownership.epochs()
        kept = [job for job in jobs if job.shard in held]
        moved = [job for job in jobs if job.shard not in held]
        if moved:
            await self._store.release((job.id for job in moved), announce=True)
        if kept:
            await self._store.release(job.id for job in kept)
            self._lanes.put_back(_entries(kept))

    def _observe(self, jobs: list[models.Claimed]) -> None:
        now_s = self._now()
        self._metrics.count_by_key(self._metrics.jobs_dispatched, jobs)
        for job in jobs:
            late_s = max(0.0, now_s - job.run_at.timestamp())
            if self._admission.held_at(job.routing_key, job.namespace, job.run_at):
                self._metrics.held_lateness.observe(late_s)  # an operator's choice: apart
            else:
                self._metrics.fire_lateness.observe(late_s)


def _entries(jobs: list[models.Claimed]) -> list[models.DueEntry]:
    return [models.DueEntry.of(job) for job in jobs]
