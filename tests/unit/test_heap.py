import random
import uuid

from dispatcher.models import DueEntry
from dispatcher.scheduler.heap import Backlog, DueHeap


def entry(run_at_s: float, shard: int = 0) -> DueEntry:
    return DueEntry(run_at_s, uuid.uuid4(), shard)


def test_pop_due_returns_only_due_entries_earliest_first() -> None:
    heap = DueHeap()
    times = [5.0, 1.0, 3.0, 2.0, 4.0]
    for t in times:
        heap.push(entry(t))
    due = heap.pop_due(3.0, limit=10)
    assert [e.run_at_s for e in due] == [1.0, 2.0, 3.0]
    assert heap.next_due_s() == 4.0
    assert len(heap) == 2


def test_pop_due_respects_limit() -> None:
    heap = DueHeap()
    heap.extend(entry(float(t)) for t in range(100))
    assert len(heap.pop_due(1000.0, limit=7)) == 7
    assert len(heap) == 93


def test_push_reports_a_new_earliest_entry() -> None:
    heap = DueHeap()
    assert heap.push(entry(10.0))
    assert not heap.push(entry(20.0))
    assert heap.push(entry(5.0))


def test_retain_drops_lost_shards() -> None:
    heap = DueHeap()
    heap.extend(entry(float(t), shard=t % 4) for t in range(40))
    dropped = heap.retain(lambda e: e.shard != 2)
    assert dropped == 10
    assert all(e.shard != 2 for e in heap.pop_due(1e9, 100))


def test_trim_keeps_the_earliest_and_returns_the_last_kept() -> None:
    rng = random.Random(7)
    heap = DueHeap()
    times = [rng.random() * 1000 for _ in range(500)]
    heap.extend(entry(t) for t in times)
    kept = heap.trim(100)
    assert kept is not None
    assert kept.run_at_s == sorted(times)[99]
    assert len(heap) == 100
    assert [e.run_at_s for e in heap.pop_due(1e9, 1000)] == sorted(times)[:100]


def test_trim_under_cap_changes_nothing() -> None:
    heap = DueHeap()
    heap.extend(entry(float(t)) for t in range(10))
    assert heap.trim(10) is None
    assert len(heap) == 10


def test_ties_on_run_at_are_ordered_by_id() -> None:
    heap = DueHeap()
    ids = sorted(uuid.uuid4() for _ in range(5))
    for job_id in reversed(ids):
        heap.push(DueEntry(1.0, job_id, 0))
    assert [e.id for e in heap.pop_due(1.0, 10)] == ids


def test_backlog_is_fifo_and_filters() -> None:
    backlog = Backlog()
    entries = [entry(float(t), shard=t % 2) for t in range(6)]
    backlog.extend(entries)
    assert backlog.pop(2) == entries[:2]
    backlog.retain(lambda e: e.shard == 0)
    assert backlog.pop(10) == [entries[2], entries[4]]
    assert backlog.pop(10) == []
