"""BulkActionStore: bulk actions' rows, their dry runs, and the batches that work them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Final

import asyncpg

from consumers_sdk import ids
from dispatcher import bulk, errors, models
from dispatcher.store import queries
from dispatcher.store.db import Database
from dispatcher.store.jobs import job_from_row

_NO_ID: Final = uuid.UUID(int=0)
_IDS: Final = ids.JobIds()  # an action's id says when it was made: lists go newest first
# A batch waits for the row locks of the jobs it changes (a claim in flight): longer than an API
# call may. A dry run counts every matching job.
BATCH_TIMEOUT_S: Final = 30.0

_STATEMENTS: Final = {
    bulk.Action.CANCEL: queries.BULK_CANCEL,
    bulk.Action.REQUEUE: queries.BULK_REQUEUE,
    bulk.Action.RESCHEDULE: queries.BULK_RESCHEDULE,
}


def _match(spec: bulk.Filter) -> list[object]:
    """The parameters of ``queries.bulk_match``, in its order."""
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


class BulkActionStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    # --- the API ---------------------------------------------------------------------------------

    async def dry_run(self, spec: bulk.Filter, *, sample: int) -> tuple[int, list[models.Job]]:
        """How many jobs match now, and the first ``sample`` of them; changes nothing."""
        async with self._db.connection(BATCH_TIMEOUT_S) as connection:
            row = await connection.fetchrow(queries.BULK_COUNT, *_states(spec), *_match(spec))
            rows = await connection.fetch(
                queries.BULK_SAMPLE, _NO_ID, sample, *_states(spec), *_match(spec)
            )
        assert row is not None  # an aggregate: always one row
        return row["matched"], [job_from_row(found) for found in rows]

    async def create(
        self,
        action: bulk.Action,
        spec: bulk.Filter,
        change: bulk.Change,
        *,
        created_by: str,
        matched_estimate: int,
    ) -> bulk.BulkAction:
        values = {
            "id": _IDS.next(),
            "action": action.value,
            **bulk.filter_columns(spec),
            "run_at": change.run_at,
            "shift_s": change.shift_s,
            "created_by": created_by,
            "matched_estimate": matched_estimate,
        }
        async with self._db.connection() as connection:
            row = await connection.fetchrow(
                queries.INSERT_BULK_ACTION, *(values[name] for name in queries.BULK_ACTION_COLUMNS)
            )
        assert row is not None
        return action_from_row(row)

    async def get(self, action_id: uuid.UUID, *, namespace: str | None) -> bulk.BulkAction:
        return await self._one(queries.SELECT_BULK_ACTION, action_id, namespace)

    async def page(
        self, *, namespace: str | None, limit: int, before: uuid.UUID | None = None
    ) -> list[bulk.BulkAction]:
        """The newest actions first: ids are UUIDv7, in creation order (a node's strictly; across
        nodes, as far as their clocks agree)."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.LIST_BULK_ACTIONS, limit, namespace, before)
        return [action_from_row(row) for row in rows]

    async def stop(self, action_id: uuid.UUID, *, namespace: str | None) -> bulk.BulkAction:
        """Stop a running action (JobStateConflict naming its status otherwise)."""
        return await self._move(queries.STOP_BULK_ACTION, action_id, namespace)

    async def resume(self, action_id: uuid.UUID, *, namespace: str | None) -> bulk.BulkAction:
        """Resume a stopped or failed action from its cursor."""
        return await self._move(queries.RESUME_BULK_ACTION, action_id, namespace)

    async def _move(
        self, query: str, action_id: uuid.UUID, namespace: str | None
    ) -> bulk.BulkAction:
        async with self._db.connection(BATCH_TIMEOUT_S) as connection:
            row = await connection.fetchrow(query, action_id, namespace)
        if row is not None:
            return action_from_row(row)
        current = await self.get(action_id, namespace=namespace)
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
        """The oldest running action no other node works, now this node's for ``lease_s``."""
        async with self._db.connection() as connection:
            row = await connection.fetchrow(queries.CLAIM_BULK_ACTION, node_id, lease_s)
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
        transaction; None when the action no longer runs here (stopped, taken over, done).
        ``shards``: where a requeue puts its jobs; ``notify_within_s``: how soon a rescheduled
        job must be due to be announced."""
        spec = action.filter
        args: list[object] = [
            *_states(spec),
            *_match(spec),
            node_id,
            bulk.detail(action.id, action.action),
        ]
        if action.action is bulk.Action.REQUEUE:
            args.append(list(shards))
        elif action.action is bulk.Action.RESCHEDULE:
            args += [action.change.run_at, action.change.shift_s, notify_within_s]
        async with self._db.connection(BATCH_TIMEOUT_S) as connection, connection.transaction():
            current = await connection.fetchrow(queries.LOCK_BULK_ACTION, action.id, node_id)
            if current is None:
                return None
            cursor: uuid.UUID = current["cursor"]
            # Planned with the filter's values: a generic plan of the pick (which the plan cache
            # may choose after five batches) walks the primary key instead of the filter's index.
            await connection.execute(queries.PLAN_EACH_RUN)
            row = await connection.fetchrow(_STATEMENTS[action.action], cursor, batch, *args)
            assert row is not None  # aggregates: always one row
            done = row["seen"] < batch
            await connection.execute(
                queries.ADVANCE_BULK_ACTION, action.id, row["last"], row["changed"], done, lease_s
            )
        due_at: datetime | None = row["at"] if action.action is bulk.Action.REQUEUE else None
        return bulk.Batch(seen=row["seen"], changed=row["changed"], done=done, due_at=due_at)

    async def fail(self, action_id: uuid.UUID, *, node_id: str, reason: str) -> None:
        async with self._db.connection() as connection:
            await connection.execute(queries.FAIL_BULK_ACTION, action_id, node_id, reason[:1000])
