"""BulkActionStore: bulk actions' rows, their dry runs, and the batches that work them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Final

import asyncpg

from consumers_sdk import bulk_rules, ids
from dispatcher import errors, models
from dispatcher.bulk import model as bulk
from dispatcher.bulk import read_gate
from dispatcher.store.db import Database
from dispatcher.store.jobs import job_from_row
from dispatcher.store.queries import bulk_actions, shared

_NO_ID: Final = uuid.UUID(int=0)
_IDS: Final = ids.JobIds()  # an action's id says when it was made: lists go newest first
# The server cuts a statement short at its limit; the block's own deadline, a little later, is
# for a server that no longer answers (then the database is away, not the statement slow).
_GRACE_S: Final = 5.0
# A count that would start within this long waits for its slot rather than answer 429: a dry run
# and the action a person (or a command with --yes) makes right after it.
_WAIT_S: Final = 1.0
# Ended actions are kept for days: the runners of every node ask each poll, a look a minute will do.
_REMOVE_EVERY_S: Final = 60.0

# The parameters a batch's pick takes after its cursor and size: the states and the filter.
_PICK_ARGUMENTS: Final = 11

_STATEMENTS: Final = {
    bulk.Action.CANCEL: bulk_actions.BULK_CANCEL,
    bulk.Action.REQUEUE: bulk_actions.BULK_REQUEUE,
    bulk.Action.RESCHEDULE: bulk_actions.BULK_RESCHEDULE,
}


def _match(spec: bulk.Filter) -> list[object]:
    """The parameters of ``bulk_actions.bulk_match``, in its order."""
    return [
        spec.namespace,
        spec.routing_key,
        spec.routing_key_prefix,
        spec.run_at_from,
        spec.run_at_to,
        spec.finished_from,
        spec.finished_to,
        spec.error_contains,
        list(spec.scope_prefixes) if spec.scope_prefixes is not None else None,
    ]


def _words(routing_keys: Sequence[str] | None) -> list[str] | None:
    return list(routing_keys) if routing_keys is not None else None


def _states(spec: bulk.Filter) -> list[object]:
    first, *rest = spec.states
    return [first, rest[0] if rest else None]


def action_from_row(row: asyncpg.Record) -> bulk.BulkAction:
    scope = row["scope_prefixes"]
    return bulk.BulkAction(
        id=row["id"],
        action=bulk.Action(row["action"]),
        filter=bulk.Filter(
            namespace=row["namespace"],
            states=tuple(row["states"]),
            routing_key=row["routing_key"],
            routing_key_prefix=row["routing_key_prefix"],
            run_at_from=row["run_at_from"],
            run_at_to=row["run_at_to"],
            finished_from=row["finished_from"],
            finished_to=row["finished_to"],
            error_contains=row["error_contains"],
            scope_prefixes=tuple(scope) if scope is not None else None,
        ),
        change=bulk.Change(run_at=row["run_at"], shift_s=row["shift_s"]),
        status=bulk.Status(row["status"]),
        reason=row["reason"],
        cursor=row["cursor"],
        touched=row["touched"],
        matched_estimate=row["matched_estimate"],
        created_by=row["created_by"],
        worked_by=row["worked_by"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


def _limit(timeout_s: float) -> str:
    """A statement_timeout setting: whole milliseconds."""
    return f"{max(1, round(timeout_s * 1000))}ms"


class BulkActionStore:
    def __init__(self, db: Database, bounds: bulk.Bounds | None = None) -> None:
        self._db = db
        self.bounds = bounds or bulk.Bounds()
        # Dry runs and new actions count jobs: the gate bounds the share of the pool (that
        # claims, clock samples and probes share) and of PostgreSQL they take; more are refused.
        self._remove_at = 0.0  # monotonic: when ended actions are next looked for
        self._reads = read_gate.ReadGate(
            slots=self.bounds.reads,
            duty=self.bounds.read_duty,
            rate_per_s=self.bounds.reads_per_s,
            mono=time.monotonic,
        )

    # --- the API ---------------------------------------------------------------------------------

    async def dry_run(
        self, spec: bulk.Filter, *, sample: int
    ) -> tuple[bulk.Count, list[models.Job]]:
        """How many jobs match now (up to the cap), and the first ``sample`` of them; changes
        nothing. Busy past ``bounds.reads`` at once; InvalidField naming the filter when the
        count takes longer than ``bounds.read_timeout_s``."""
        slot = self._reads.enter()
        if isinstance(slot, read_gate.Refused) and slot.wait_s <= _WAIT_S:
            await asyncio.sleep(slot.wait_s)  # a dry run's rest, before the action it shows
            slot = self._reads.enter()
        if isinstance(slot, read_gate.Refused):
            raise errors.Busy(
                "this node counts as many jobs for bulk actions as it allows: retry",
                retry_after_s=slot.retry_after_s,
            )
        started = time.monotonic()
        try:
            return await self._count(spec, sample)
        finally:
            self._reads.leave(slot, took_s=time.monotonic() - started)

    async def _count(self, spec: bulk.Filter, sample: int) -> tuple[bulk.Count, list[models.Job]]:
        timeout_s = self.bounds.read_timeout_s
        async with self._db.connection(timeout_s + _GRACE_S) as connection:
            try:
                async with connection.transaction(readonly=True):
                    await connection.execute(bulk_actions.LIMIT_STATEMENT_TIME, _limit(timeout_s))
                    row = await connection.fetchrow(
                        bulk_actions.BULK_COUNT,
                        *_states(spec),
                        *_match(spec),
                        self.bounds.count_cap + 1,
                    )
                    rows = (
                        await connection.fetch(
                            bulk_actions.BULK_SAMPLE, _NO_ID, sample, *_states(spec), *_match(spec)
                        )
                        if sample
                        else []
                    )
            except asyncpg.QueryCanceledError:
                raise errors.InvalidField(
                    "filter",
                    f"counting the jobs it matches took over {timeout_s:g} s: narrow it"
                    " (a routing_key, a state, a run_at range)",
                ) from None
        assert row is not None  # an aggregate: always one row
        cap = self.bounds.count_cap
        count = bulk.Count(matched=min(row["matched"], cap), at_least=row["matched"] > cap)
        return count, [job_from_row(found) for found in rows]

    async def create(
        self,
        action: bulk.Action,
        spec: bulk.Filter,
        change: bulk.Change,
        *,
        created_by: str,
        by_operator: bool,
        matched_estimate: int,
    ) -> bulk.BulkAction:
        """Store a running action; BulkLimitReached past its namespace's budget."""
        values = {
            "id": _IDS.next(),
            "action": action.value,
            **bulk.filter_columns(spec),
            "run_at": change.run_at,
            "shift_s": change.shift_s,
            "created_by": created_by,
            "matched_estimate": matched_estimate,
            "by_operator": by_operator,
        }
        async with self._db.connection() as connection, connection.transaction():
            await self._within_budget(connection, spec.namespace, by_operator, stored=True)
            row = await connection.fetchrow(
                bulk_actions.INSERT_BULK_ACTION,
                *(values[name] for name in bulk_actions.BULK_ACTION_COLUMNS),
            )
        assert row is not None
        return action_from_row(row)

    async def _within_budget(
        self,
        connection: asyncpg.pool.PoolConnectionProxy,
        namespace: str | None,
        by_operator: bool,
        *,
        stored: bool,
    ) -> None:
        """Take the budget's lock for the transaction; BulkLimitReached when one more running
        action (and, with ``stored``, one more stored) would pass it."""
        await connection.execute(bulk_actions.LOCK_BULK_BUDGET, namespace, by_operator)
        used = await connection.fetchrow(bulk_actions.BULK_BUDGET, namespace, by_operator)
        assert used is not None  # an aggregate: always one row
        whose = "an operator's" if by_operator else "this namespace's"
        if stored and used["stored"] >= self.bounds.max_stored:
            raise errors.BulkLimitReached(
                f"{whose} {self.bounds.max_stored} stored bulk actions are as many as"
                " DISPATCHER_BULK_MAX_STORED allows: ended ones are removed"
                f" {self.bounds.keep_s:g} s after they end"
            )
        if used["running"] >= self.bounds.max_running:
            raise errors.BulkLimitReached(
                f"{whose} {self.bounds.max_running} running bulk actions are as many as"
                " DISPATCHER_BULK_MAX_RUNNING allows: stop one, or wait for one to end"
            )

    # ``namespace`` and ``routing_keys`` are the caller's filters (``api_keys.Principal``'s
    # ``namespace_filter`` and ``routing_key_filter``): an action outside them is not found.

    async def get(
        self, action_id: uuid.UUID, *, namespace: str | None, routing_keys: Sequence[str] | None
    ) -> bulk.BulkAction:
        return await self._one(
            bulk_actions.SELECT_BULK_ACTION, action_id, namespace, _words(routing_keys)
        )

    async def page(
        self,
        *,
        namespace: str | None,
        routing_keys: Sequence[str] | None,
        limit: int,
        before: uuid.UUID | None = None,
    ) -> list[bulk.BulkAction]:
        """The newest actions first: ids are UUIDv7, in creation order (a node's strictly; across
        nodes, as far as their clocks agree)."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(
                bulk_actions.LIST_BULK_ACTIONS, limit, namespace, _words(routing_keys), before
            )
        return [action_from_row(row) for row in rows]

    async def stop(
        self, action_id: uuid.UUID, *, namespace: str | None, routing_keys: Sequence[str] | None
    ) -> bulk.BulkAction:
        """Stop a running action (JobStateConflict naming its status otherwise)."""
        return await self._move(bulk_actions.STOP_BULK_ACTION, action_id, namespace, routing_keys)

    async def resume(
        self, action_id: uuid.UUID, *, namespace: str | None, routing_keys: Sequence[str] | None
    ) -> bulk.BulkAction:
        """Resume a stopped or failed action from its cursor, within its namespace's budget of
        running actions (BulkLimitReached past it)."""
        return await self._move(
            bulk_actions.RESUME_BULK_ACTION, action_id, namespace, routing_keys, budgeted=True
        )

    async def _move(
        self,
        query: str,
        action_id: uuid.UUID,
        namespace: str | None,
        routing_keys: Sequence[str] | None,
        *,
        budgeted: bool = False,
    ) -> bulk.BulkAction:
        timeout_s = self.bounds.batch_timeout_s + _GRACE_S  # a stop waits for a batch in flight
        async with self._db.connection(timeout_s) as connection, connection.transaction():
            if budgeted:
                found = await connection.fetchrow(
                    bulk_actions.SELECT_BULK_ACTION, action_id, namespace, _words(routing_keys)
                )
                if found is not None and found["status"] != bulk.Status.RUNNING:
                    await self._within_budget(
                        connection, found["namespace"], found["by_operator"], stored=False
                    )
            row = await connection.fetchrow(query, action_id, namespace, _words(routing_keys))
        if row is not None:
            return action_from_row(row)
        current = await self.get(action_id, namespace=namespace, routing_keys=routing_keys)
        raise errors.JobStateConflict(
            current.status.value, f"the bulk action is {current.status.value}"
        )

    async def _one(self, query: str, *args: object) -> bulk.BulkAction:
        async with self._db.connection() as connection:
            row = await connection.fetchrow(query, *args)
        if row is None:
            raise errors.BulkActionNotFound()
        return action_from_row(row)

    # --- the workers ----------------------------------------------------------------------------

    async def claim(self, *, node_id: str, lease_s: float) -> bulk.BulkAction | None:
        """The running action whose turn it is (``bulk_actions.CLAIM_BULK_ACTION``), now this node's
        for ``lease_s``."""
        async with self._db.connection() as connection:
            row = await connection.fetchrow(bulk_actions.CLAIM_BULK_ACTION, node_id, lease_s)
        return action_from_row(row) if row is not None else None

    async def run_batch(
        self,
        action: bulk.BulkAction,
        *,
        node_id: str,
        batch: int,
        lease_s: float,
        shards: Sequence[int] = (),
        notify_within_s: float = 0.0,
    ) -> bulk.Batch | None:
        """Change the next ``batch`` matching jobs after the action's cursor and advance it, in one
        transaction, renewing this node's lease for ``lease_s``; None when the action no
        longer runs here (stopped, taken over, done). BulkBatchTooSlow past
        ``bounds.batch_timeout_s``.
        ``shards``: where a requeue puts its jobs; ``notify_within_s``: how soon a rescheduled
        job must be due to be announced."""
        spec = action.filter
        args: list[object] = [
            *_states(spec),
            *_match(spec),
            node_id,
            bulk_rules.detail(action.id, action.action),
        ]
        if action.action is bulk.Action.REQUEUE:
            args.append(list(shards))
        elif action.action is bulk.Action.RESCHEDULE:
            args += [action.change.run_at, action.change.shift_s, notify_within_s]
        timeout_s = self.bounds.batch_timeout_s
        async with self._db.connection(timeout_s + _GRACE_S) as connection:
            try:
                async with connection.transaction():
                    current = await connection.fetchrow(
                        bulk_actions.LOCK_BULK_ACTION, action.id, node_id
                    )
                    if current is None:
                        return None
                    cursor: uuid.UUID = current["cursor"]
                    await connection.execute(bulk_actions.LIMIT_STATEMENT_TIME, _limit(timeout_s))
                    # Planned with the filter's values: a generic plan of the pick (which the
                    # plan cache may choose after five batches) walks the primary key instead of
                    # the filter's index.
                    await connection.execute(shared.PLAN_EACH_RUN)
                    # The batch's jobs, and their shards fenced; then, in a new snapshot, the
                    # change (``bulk_actions.BULK_FENCE``).
                    picked = await connection.fetchrow(
                        bulk_actions.BULK_FENCE, cursor, batch, *args[:_PICK_ARGUMENTS]
                    )
                    assert picked is not None  # aggregates: always one row
                    row = await connection.fetchrow(
                        _STATEMENTS[action.action], picked["ids"], picked["shards"], *args
                    )
                    assert row is not None
                    done = picked["seen"] < batch
                    await connection.execute(
                        bulk_actions.ADVANCE_BULK_ACTION,
                        action.id,
                        picked["last"],
                        row["changed"],
                        done,
                        lease_s,
                    )
            except asyncpg.QueryCanceledError:
                raise errors.BulkBatchTooSlow(
                    f"a batch of {batch} jobs took over {timeout_s:g} s"
                    " (DISPATCHER_BULK_BATCH_TIMEOUT_S): narrow the filter, or resume it"
                ) from None
        due_at: datetime | None = row["at"] if action.action is bulk.Action.REQUEUE else None
        return bulk.Batch(seen=picked["seen"], changed=row["changed"], done=done, due_at=due_at)

    async def release(self, action_id: uuid.UUID, *, node_id: str) -> None:
        """Let go of an action this node holds between batches: another node may take it."""
        async with self._db.connection() as connection:
            await connection.execute(bulk_actions.RELEASE_BULK_ACTION, action_id, node_id)

    async def remove_ended(self) -> int:
        """Remove the actions done, failed or stopped longer than ``bounds.keep_s`` ago: looked
        for at most every quarter of that time (a minute at most), however often asked."""
        now = time.monotonic()
        if now < self._remove_at:
            return 0
        self._remove_at = now + min(_REMOVE_EVERY_S, self.bounds.keep_s / 4)
        async with self._db.connection() as connection:
            removed = await connection.fetchval(
                bulk_actions.REMOVE_ENDED_BULK_ACTIONS, self.bounds.keep_s
            )
        return int(removed)

    async def fail(self, action_id: uuid.UUID, *, node_id: str, reason: str) -> None:
        async with self._db.connection() as connection:
            await connection.execute(
                bulk_actions.FAIL_BULK_ACTION, action_id, node_id, reason[:1000]
            )
