"""The bulk action runner: every node runs this loop; it works the running bulk actions.

An action is worked by one node at a time: taken with a lease (``FOR UPDATE SKIP LOCKED``, so
nodes never wait for each other), renewed by each batch, and taken over by another node once the
lease runs out (the worker died). Between two batches a node takes the next turn (``bulk``,
"Bounds"): the same action, or another, letting go of the one it held. Each batch is one
transaction that locks the action, changes at most ``batch`` jobs after its cursor and moves the
cursor past them: a job is changed at most once, and a stop (or a takeover) takes effect between
two batches.

Between batches the runner rests in proportion to the time the batch took (``duty``), so that a
million-job action leaves PostgreSQL and the event loop to firing most of the time.

Jobs a requeue made due now are put on shards this node owns; ``on_requeued`` then has this
node's loader walk them at the catch-up pace (``Loader.catch_up``) instead of a due notice per job.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from dispatcher import errors, metrics, supervision
from dispatcher.bulk import model as bulk
from dispatcher.store.bulk_actions import BulkActionStore
from dispatcher.timing.kinds import Mono

logger = logging.getLogger(__name__)
_LOG = {"action": "bulk"}
# A batch failing this many times in a row on something else than the services being away (a
# value PostgreSQL refuses, a bug) fails its action, with the reason: it is not retried forever.
MAX_FAILURES = 3


class BulkRunner:
    def __init__(
        self,
        store: BulkActionStore,
        metrics: metrics.Metrics,
        *,
        node_id: str,
        batch: int,
        poll_s: float,
        lease_s: float,
        duty: float,
        rate_per_s: float,
        shards: Callable[[], Sequence[int]],
        notify_within_s: float,
        on_requeued: Callable[[datetime], None],
        mono: Mono = time.monotonic,
    ) -> None:
        """``shards``: those this node owns now; ``notify_within_s``: how soon a rescheduled job
        must be due to need a due notice (the loaded window)."""
        self._store = store
        self._metrics = metrics
        self._node_id = node_id
        self._batch = batch
        self._lease_s = lease_s
        self._rest = (1.0 - duty) / duty  # seconds of rest per second of batch
        self._rate_per_s = rate_per_s
        self._shards = shards
        self._notify_within_s = notify_within_s
        self._on_requeued = on_requeued
        self._mono = mono
        self._rounds = supervision.Rounds(  # the batch in flight of a failed round rolled back
            "bulk",
            poll_s,
            on_paused=lambda exc: logger.warning("bulk actions paused: %s", exc, extra=_LOG),
        )

    def stop(self) -> None:
        self._rounds.stop()

    def wake(self) -> None:
        """An action was made or resumed: look at once rather than at the next poll."""
        self._rounds.wake()

    async def run(self) -> None:
        await self._rounds.run(self._round)

    async def _round(self) -> None:
        await self.work()

    async def work(self) -> int:
        """Work running actions a batch at a time, each batch to the action whose turn it is
        (``bulk``, "Bounds"), until none is left for this node (or ``stop``); returns how many
        jobs were changed. Ended actions past their keeping time are removed first."""
        await self._store.remove_ended()
        changed = 0
        failures: dict[uuid.UUID, int] = {}
        held: uuid.UUID | None = None  # the action this node keeps between its batches
        while not self._rounds.stopping:
            action = await self._store.claim(node_id=self._node_id, lease_s=self._lease_s)
            if held is not None and (action is None or action.id != held):
                await self._store.release(held, node_id=self._node_id)
            held = action.id if action is not None else None
            if action is None:
                break
            if action.cursor.int == 0 and action.touched == 0:
                logger.info(
                    "bulk action %s (%s) started",
                    action.id,
                    action.action.value,
                    extra={**_LOG, "bulk_action": str(action.id)},
                )
            started = self._mono()
            done = await self._one_batch(action, failures)
            if done is None or done.done:
                held = None  # ended, stopped, taken over or failed: not this node's to let go
            if done is None:
                continue
            changed += done.changed
            # Rest in proportion to the batch (firing shares the database and this loop), and
            # long enough to keep to the rate (a requeue's jobs fire as fast as they are made
            # due), whichever action comes next.
            work_s = self._mono() - started
            rest_s = max(work_s * self._rest, done.changed / self._rate_per_s - work_s)
            await self._rounds.pause(min(rest_s, self._lease_s / 4))
        return changed

    async def _one_batch(
        self, action: bulk.BulkAction, failures: dict[uuid.UUID, int]
    ) -> bulk.Batch | None:
        """One batch of ``action``; None when it did nothing (stopped, taken over, failed)."""
        try:
            done = await self._store.run_batch(
                action,
                node_id=self._node_id,
                batch=self._batch,
                lease_s=self._lease_s,
                shards=list(self._shards()),
                notify_within_s=self._notify_within_s,
            )
        except errors.TRANSIENT:
            raise
        except errors.BulkBatchTooSlow as exc:  # its reason is the action's, not the node's
            logger.warning("bulk action %s failed: %s", action.id, exc, extra=_LOG)
            await self._store.fail(action.id, node_id=self._node_id, reason=str(exc))
            return None
        except Exception as exc:  # one bad action never takes the loop down
            failures[action.id] = failures.get(action.id, 0) + 1
            logger.exception("bulk action %s: batch failed", action.id, extra=_LOG)
            if failures[action.id] >= MAX_FAILURES:
                await self._store.fail(action.id, node_id=self._node_id, reason=repr(exc))
            return None
        failures.pop(action.id, None)
        if done is None:  # stopped, or another node took it over
            return None
        self._metrics.bulk_jobs_changed.labels(action=action.action.value).inc(done.changed)
        if done.due_at is not None and done.changed:
            self._on_requeued(done.due_at)
        if done.done:
            logger.info("bulk action %s done", action.id, extra=_LOG)
        return done
