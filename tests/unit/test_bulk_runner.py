"""The bulk action runner against a store that answers from a script: an action worked batch by
batch to its end, each batch a turn claimed anew, its requeued jobs handed to the loader, a batch
that keeps failing on its jobs (or once takes too long) fails the action (and only it), the
services away reach the supervisor, and a stop ends the work between batches."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from consumers_sdk import bulk_rules
from dispatcher import errors
from dispatcher.bulk import model as bulk
from dispatcher.bulk.runner import MAX_FAILURES, BulkRunner
from dispatcher.metrics import Metrics

AT = datetime(2026, 11, 29, tzinfo=UTC)


def action(kind: bulk.Action = bulk.Action.REQUEUE) -> bulk.BulkAction:
    return bulk.BulkAction(
        id=uuid.uuid4(),
        action=kind,
        filter=bulk.Filter(namespace=None, states=bulk_rules.APPLIES_TO[kind]),
        change=bulk.Change(),
        status=bulk.Status.RUNNING,
        reason=None,
        cursor=uuid.UUID(int=0),
        touched=0,
        matched_estimate=3,
        created_by="admin",
        worked_by=None,
        created_at=AT,
        updated_at=AT,
        finished_at=None,
    )


class ScriptedStore:
    """Hands out the first of ``actions`` at each claim, while it runs (a batch answered None or
    done, or a fail, ends it); each batch is the next step of ``batches`` (a Batch, None, or an
    exception to raise)."""

    def __init__(self, actions: list[bulk.BulkAction], batches: list[Any]) -> None:
        self.actions = actions
        self.batches = batches
        self.failed: list[tuple[uuid.UUID, str]] = []
        self.calls = 0
        self.claims: list[uuid.UUID | None] = []
        self.removals = 0
        self.released: list[uuid.UUID] = []
        self.on_batch: Callable[[], None] = lambda: None

    async def claim(self, *, node_id: str, lease_s: float) -> bulk.BulkAction | None:
        self.claims.append(self.actions[0].id if self.actions else None)
        return self.actions[0] if self.actions else None

    async def run_batch(self, action: bulk.BulkAction, **_: object) -> bulk.Batch | None:
        self.calls += 1
        self.on_batch()
        step = self.batches.pop(0)
        if isinstance(step, Exception):
            raise step
        if step is None or step.done:
            self.actions.remove(action)
        return step  # type: ignore[no-any-return]

    async def fail(self, action_id: uuid.UUID, *, node_id: str, reason: str) -> None:
        self.failed.append((action_id, reason))
        self.actions = [a for a in self.actions if a.id != action_id]

    async def release(self, action_id: uuid.UUID, *, node_id: str) -> None:
        self.released.append(action_id)

    async def remove_ended(self) -> int:
        self.removals += 1
        return 0


def runner(
    store: ScriptedStore, requeued: list[datetime], *, rate_per_s: float = 1e9
) -> BulkRunner:
    return BulkRunner(
        store,  # type: ignore[arg-type]
        Metrics(),
        node_id="n1",
        batch=2,
        poll_s=0.01,
        lease_s=30,
        duty=1.0,  # no rest between batches
        rate_per_s=rate_per_s,
        shards=lambda: [0, 1],
        notify_within_s=60,
        on_requeued=requeued.append,
    )


async def test_an_action_is_worked_to_its_end_and_its_requeued_jobs_go_to_the_loader() -> None:
    store = ScriptedStore(
        [action()],
        [
            bulk.Batch(seen=2, changed=2, done=False, due_at=AT),
            bulk.Batch(seen=2, changed=0, done=False, due_at=AT),  # nothing matched any more
            bulk.Batch(seen=1, changed=1, done=True, due_at=AT),
        ],
    )
    requeued: list[datetime] = []
    assert await runner(store, requeued).work() == 3
    assert requeued == [AT, AT]  # only the batches that changed jobs
    assert store.failed == []


async def test_the_rate_spaces_the_batches_that_change_jobs() -> None:
    """40 jobs changed in four batches at 200 a second take 0.15 s at least (the rest after each
    but the last), however fast the batches themselves."""
    store = ScriptedStore(
        [action()],
        [bulk.Batch(seen=10, changed=10, done=False, due_at=AT)] * 3
        + [bulk.Batch(seen=10, changed=10, done=True, due_at=AT)],
    )
    started = time.monotonic()
    assert await runner(store, [], rate_per_s=200).work() == 40
    assert time.monotonic() - started >= 0.15


async def test_a_batch_failing_on_its_jobs_fails_its_action_and_the_next_is_worked() -> None:
    broken, fine = action(), action(bulk.Action.CANCEL)
    store = ScriptedStore(
        [broken, fine],
        [ValueError("a value PostgreSQL refused")] * MAX_FAILURES
        + [bulk.Batch(seen=1, changed=1, done=True)],
    )
    assert await runner(store, []).work() == 1
    [(failed, reason)] = store.failed
    assert failed == broken.id
    assert "a value PostgreSQL refused" in reason


async def test_a_batch_past_its_time_fails_its_action_at_once_and_the_next_is_worked() -> None:
    slow, fine = action(), action(bulk.Action.CANCEL)
    store = ScriptedStore(
        [slow, fine],
        [
            errors.BulkBatchTooSlow("a batch of 2 jobs took over 30 s"),
            bulk.Batch(seen=1, changed=1, done=True),
        ],
    )
    assert await runner(store, []).work() == 1
    assert store.failed == [(slow.id, "a batch of 2 jobs took over 30 s")]


async def test_each_batch_is_a_turn_claimed_anew_and_ended_actions_are_removed_first() -> None:
    worked = action()
    store = ScriptedStore(
        [worked],
        [bulk.Batch(seen=2, changed=2, done=False)] * 2
        + [bulk.Batch(seen=1, changed=1, done=True)],
    )
    assert await runner(store, []).work() == 5
    assert store.claims == [worked.id] * 3 + [None]
    assert store.removals == 1


async def test_a_node_lets_go_of_the_action_it_held_when_it_takes_another_ones_turn() -> None:
    first, second = action(), action(bulk.Action.CANCEL)
    more, last = bulk.Batch(seen=2, changed=2, done=False), bulk.Batch(seen=1, changed=1, done=True)
    store = ScriptedStore([first], [more, more, last, last])  # first, second, second, first
    store.on_batch = lambda: store.actions.insert(0, second) if store.calls == 1 else None
    await runner(store, []).work()
    assert store.released == [first.id]


async def test_the_services_away_reach_the_caller_without_failing_the_action() -> None:
    store = ScriptedStore([action()], [errors.StoreUnavailable()])
    with pytest.raises(errors.StoreUnavailable):
        await runner(store, []).work()
    assert store.failed == []


async def test_a_stop_ends_the_work_between_batches() -> None:
    store = ScriptedStore([action()], [bulk.Batch(seen=2, changed=2, done=False)] * 10)
    worker = runner(store, [])
    store.on_batch = lambda: worker.stop() if store.calls == 2 else None
    assert await worker.work() == 4
    assert store.calls == 2


async def test_run_stops_when_asked_while_waiting_for_work() -> None:
    worker = runner(ScriptedStore([], []), [])
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(0.05)
    worker.stop()
    await asyncio.wait_for(task, 1)
