import random
import uuid

from dispatcher.firing.heap import Backlog, DueHeap
from dispatcher.models import DueEntry


def entry(run_at_s: float, shard: int = 0) -> DueEntry:
    return DueEntry.make(run_at_s, uuid.uuid4(), shard)


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
        heap.push(DueEntry.make(1.0, job_id, 0))
    assert [e.id for e in heap.pop_due(1.0, 10)] == ids


def test_backlog_is_fifo_and_filters() -> None:
    backlog = Backlog()
    entries = [entry(float(t), shard=t % 2) for t in range(6)]
    backlog.extend(entries)
    assert backlog.pop(2) == entries[:2]
    backlog.retain(lambda e: e.shard == 0)
    assert backlog.pop(10) == [entries[2], entries[4]]
    assert backlog.pop(10) == []


def keyed(run_at_s: float, key: str) -> DueEntry:
    return DueEntry.make(run_at_s, uuid.uuid4(), 0, key)


def test_a_batch_takes_turns_between_routing_keys() -> None:
    heap = DueHeap()
    heap.extend(keyed(1.0 + i * 1e-6, "big") for i in range(1000))
    heap.extend(keyed(5.0 + i, "small") for i in range(3))
    heap.push(keyed(4.0, "other"))
    batch = heap.pop_due(10.0, limit=8)
    assert [e.key for e in batch].count("big") == 4  # not the whole batch, though it is earlier
    assert [e.key for e in batch if e.key != "big"] == ["other", "small", "small", "small"]
    assert [e.run_at_s for e in batch if e.key == "big"] == sorted(
        e.run_at_s for e in batch if e.key == "big"
    )
    assert len(heap) == 996


def test_keys_not_yet_due_wait_their_time() -> None:
    heap = DueHeap()
    heap.extend(keyed(float(t), "a") for t in range(10))
    heap.push(keyed(100.0, "b"))
    assert {e.key for e in heap.pop_due(50.0, 100)} == {"a"}
    assert heap.next_due_s() == 100.0
    assert heap.push(keyed(20.0, "c"))  # a new earliest entry wakes the firing loop
    assert [e.key for e in heap.pop_due(1000.0, 100)] == ["c", "b"]
    assert len(heap) == 0
    assert heap.next_due_s() is None


def test_random_pushes_and_pops_lose_nothing_and_respect_due_times() -> None:
    rng = random.Random(11)
    heap = DueHeap()
    pushed: set[uuid.UUID] = set()
    popped: list[DueEntry] = []
    now = 0.0
    for _ in range(3000):
        if rng.random() < 0.6:
            item = keyed(now + rng.uniform(-5, 20), rng.choice("abcde"))
            heap.push(item)
            pushed.add(item.id)
        else:
            now += rng.uniform(0, 2)
            batch = heap.pop_due(now, rng.randint(1, 20))
            assert all(e.run_at_s <= now for e in batch)
            for key in set(e.key for e in batch):  # each key's own entries earliest first
                times = [e.run_at_s for e in batch if e.key == key]
                assert times == sorted(times)
            popped += batch
        assert len(heap) == len(pushed) - len(popped)
    popped += heap.pop_due(1e9, 10**6)
    assert sorted(e.id for e in popped) == sorted(pushed)


def test_evict_before_drops_the_late_entries_and_names_the_earliest() -> None:
    heap = DueHeap()
    heap.extend(keyed(float(t), "k" if t % 2 else "j") for t in range(10))
    assert heap.evict_before(0.0) is None
    assert heap.evict_before(4.0) == 0.0
    assert len(heap) == 6
    assert heap.next_due_s() == 4.0


def test_backlog_takes_turns_between_keys_oldest_first_within_each() -> None:
    backlog = Backlog()
    big = [keyed(float(t), "big") for t in range(100)]
    small = [keyed(50.0 + t, "small") for t in range(2)]
    backlog.extend(big)
    backlog.extend(small)
    assert backlog.pop(4) == [big[0], small[0], big[1], small[1]]
    assert backlog.pop(3) == big[2:5]
    assert len(backlog) == 95


def ranked(run_at_s: float, priority: int | None, key: str = "k") -> DueEntry:
    return DueEntry.make(run_at_s, uuid.uuid4(), 0, key, priority)


def test_of_jobs_due_at_the_same_instant_the_higher_priority_fires_first() -> None:
    heap = DueHeap()
    low, none, high, earlier = ranked(5.0, 1), ranked(5.0, None), ranked(5.0, 9), ranked(4.0, 0)
    heap.extend([low, none, high, earlier])
    assert heap.pop_due(10.0, limit=10) == [earlier, high, low, none]
    assert high.priority == 9
    assert none.priority == 0


def test_a_catch_up_fires_the_highest_priority_first_then_the_oldest() -> None:
    backlog = Backlog()
    jobs = [ranked(float(t), p) for t, p in [(1, 0), (2, 9), (3, 5), (4, 9), (5, None), (6, 5)]]
    backlog.extend(jobs)
    assert [(e.run_at_s, e.priority) for e in backlog.pop(10)] == [
        (2.0, 9),
        (4.0, 9),
        (3.0, 5),
        (6.0, 5),
        (1.0, 0),
        (5.0, 0),
    ]


def test_priority_orders_within_a_routing_key_and_keys_still_take_turns() -> None:
    backlog = Backlog()
    urgent = [ranked(float(t), 9, "urgent") for t in range(4)]
    plain = [ranked(float(t), None, "plain") for t in range(4)]
    backlog.extend(plain + urgent)
    taken = backlog.pop(4)
    assert [e.key for e in taken] == ["plain", "urgent", "plain", "urgent"]
