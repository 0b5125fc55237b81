"""The due lanes and the rule that makes a firing batch of them: no I/O, the time passed in."""

import asyncio
import uuid

import pytest

from dispatcher.firing.lanes import CLAIM_AHEAD_S, CLAIM_LEAD_S, Demoted, Lanes
from dispatcher.firing.pacing import Pace
from dispatcher.models import DueEntry

NOW = 1000.0


def entry(run_at_s: float, key: str = "k", shard: int = 0) -> DueEntry:
    return DueEntry.make(run_at_s, uuid.uuid4(), shard, key)


def lanes(*, share: float = 0.2, rate: float = 0.0, batch: int = 10) -> Lanes:
    return Lanes(catchup_share=share, pace=Pace(rate, batch=batch))


def overdue(count: int, key: str = "late") -> list[DueEntry]:
    return [entry(NOW - 100.0 + n, key) for n in range(count)]


def test_live_jobs_come_out_when_due_earliest_first() -> None:
    due = lanes()
    later, first, second = entry(NOW + 5.0), entry(NOW - 2.0), entry(NOW - 1.0)
    due.fill_live([later, second, first])
    assert due.take(NOW, 10, live_only=False) == [first, second]
    assert due.live_count == 1
    assert due.next_live_s() == NOW + 5.0
    assert due.take(NOW, 10, live_only=False) == []


def test_a_batch_keeps_its_share_for_the_backlog_while_live_jobs_are_due() -> None:
    due = lanes(share=0.2)
    live = [entry(NOW - 1.0 + n * 0.001, "live") for n in range(20)]
    late = overdue(20)
    due.fill_live(live)
    due.fill_backlog(late)
    batch = due.take(NOW, 10, live_only=False)
    assert batch == live[:8] + late[:2]  # the backlog's share: 20% of the batch
    assert (due.live_count, due.backlog_count) == (12, 18)


def test_the_backlog_has_the_rest_of_a_batch_when_few_live_jobs_are_due() -> None:
    due = lanes(share=0.2)
    live = [entry(NOW - 1.0, "live") for _ in range(3)]
    late = overdue(20)
    due.fill_live(live)
    due.fill_backlog(late)
    batch = due.take(NOW, 10, live_only=False)
    assert sorted(batch[:3]) == sorted(live)
    assert batch[3:] == late[:7]


def test_the_backlog_takes_turns_between_routing_keys_oldest_first() -> None:
    due = lanes()
    big, small = overdue(10, "big"), overdue(2, "small")
    due.fill_backlog(big + small)
    assert due.take(NOW, 4, live_only=False) == [big[0], small[0], big[1], small[1]]


def test_the_catch_up_pace_holds_the_backlog_back_and_says_when_to_wake() -> None:
    # 100 jobs/s, a batch of 10: a bucket of 10, handed out in chunks of 5.
    due = lanes(rate=100.0)
    due.fill_backlog(overdue(50))
    assert len(due.take(0.0, 10, live_only=False)) == 10
    assert due.take(0.0, 10, live_only=False) == []
    assert due.next_wake_s(0.0, live_only=False) == pytest.approx(0.05)
    assert len(due.take(0.05, 10, live_only=False)) == 5
    assert due.backlog_count == 35


def test_the_pace_never_holds_back_live_jobs() -> None:
    due = lanes(rate=1.0)
    due.fill_backlog(overdue(50))
    due.take(0.0, 10, live_only=False)  # spends the bucket
    live = [entry(-1.0) for _ in range(5)]
    due.fill_live(live)
    assert sorted(due.take(0.0, 10, live_only=False)) == sorted(live)


def test_the_live_worker_takes_only_live_jobs() -> None:
    due = lanes()
    live = entry(NOW - 1.0)
    due.fill_live([live])
    due.fill_backlog(overdue(5))
    due.recover([entry(NOW - 50.0)])
    assert due.take(NOW, 10, live_only=True) == [live]
    assert due.take(NOW, 10, live_only=True) == []
    assert (due.backlog_count, due.recovery_count) == (5, 1)


def test_live_jobs_due_within_the_claims_reach_are_taken_ahead() -> None:
    due = lanes()
    soon = entry(NOW + CLAIM_LEAD_S / 2)
    within = entry(NOW + CLAIM_AHEAD_S * 0.8)
    beyond = entry(NOW + CLAIM_AHEAD_S * 1.2)
    due.fill_live([soon, within, beyond])
    assert due.take(NOW - CLAIM_LEAD_S, 10, live_only=True) == []  # not yet within the lead
    assert due.take(NOW, 10, live_only=True) == [soon, within]
    assert due.take(NOW, 10, live_only=False) == []  # beyond is not within the lead yet


def test_a_batch_with_overdue_jobs_takes_no_live_job_ahead() -> None:
    due = lanes()
    soon = entry(NOW + CLAIM_LEAD_S / 2)
    late = overdue(3)
    due.fill_live([soon])
    due.fill_backlog(late)
    assert due.take(NOW, 10, live_only=False) == late
    assert due.take(NOW, 10, live_only=False) == [soon]  # the backlog is empty: ahead again


def test_the_recovery_lane_goes_first_unpaced_in_a_quarter_of_the_batch() -> None:
    due = lanes(rate=1.0)
    found = [entry(NOW - 60.0 + n) for n in range(5)]
    live = [entry(NOW - 1.0, "live") for _ in range(10)]
    assert due.recover(found) == 5
    due.fill_live(live)
    due.fill_backlog(overdue(10))
    batch = due.take(NOW, 8, live_only=False)
    assert batch[:2] == found[:2]  # a quarter of 8, oldest finds first
    assert len(batch) == 8
    assert set(batch[2:]) <= set(live)  # the rest live, no backlog
    assert due.take(NOW, 8, live_only=False)[:2] == found[2:4]
    assert due.take(NOW, 2, live_only=False)[:1] == found[4:]  # a small batch still takes one
    assert due.backlog_count == 10


def test_the_recovery_lane_takes_a_job_once_until_it_is_fired() -> None:
    due = lanes()
    orphan, expired = entry(NOW - 5.0), entry(NOW - 4.0)
    assert due.recover([orphan, expired, orphan]) == 2  # orphaned and past its lease: once
    assert due.recover([orphan]) == 0  # still waiting in the lane
    assert due.take(NOW, 8, live_only=False) == [orphan, expired]
    assert due.recover([orphan]) == 1  # taken: found again, it is taken again


def test_put_back_entries_fire_again_and_wake_the_firer() -> None:
    due = lanes()
    failed = [entry(NOW - 1.0), entry(NOW - 0.5)]
    due.fill_live([entry(NOW - 2.0)])
    due.due.clear()
    due.put_back(failed)
    assert due.due.is_set()  # not the earliest, and still a wake-up
    assert due.take(NOW, 10, live_only=False)[1:] == failed


def test_a_delayed_put_back_waits_for_its_time() -> None:
    due = lanes()
    due.put_back([entry(NOW + 3.0)])
    assert due.take(NOW, 10, live_only=False) == []
    assert due.next_wake_s(NOW, live_only=False) == pytest.approx(3.0 - CLAIM_LEAD_S)


def test_an_offer_wakes_the_firer_only_when_it_is_the_earliest() -> None:
    due = lanes()
    due.offer([entry(NOW + 10.0)])
    assert due.due.is_set()
    due.due.clear()
    due.offer([entry(NOW + 20.0)])
    assert not due.due.is_set()
    due.offer([entry(NOW + 30.0), entry(NOW + 5.0)])
    assert due.due.is_set()
    assert due.live_count == 4


def test_loads_wake_the_firer_when_they_bring_entries() -> None:
    due = lanes()
    due.fill_live([])
    due.fill_backlog([])
    due.recover([])
    assert not due.due.is_set()
    due.fill_backlog(overdue(1))
    assert due.due.is_set()
    due.due.clear()
    due.fill_live([entry(NOW + 60.0)])
    assert due.due.is_set()
    due.due.clear()
    due.recover([entry(NOW)])
    assert due.due.is_set()


async def test_a_waiting_worker_wakes_when_something_falls_due() -> None:
    due = lanes()
    waiter = asyncio.create_task(due.due.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    due.offer([entry(NOW)])
    await asyncio.wait_for(waiter, 1.0)


def test_next_wake_is_the_claims_lead_before_the_next_live_job() -> None:
    due = lanes()
    assert due.next_wake_s(NOW, live_only=False) is None  # nothing held: until woken
    due.fill_live([entry(NOW + 1.0)])
    assert due.next_wake_s(NOW, live_only=True) == pytest.approx(1.0 - CLAIM_LEAD_S)


def test_next_wake_with_a_paced_backlog_is_the_sooner_of_the_pace_and_the_live_job() -> None:
    due = lanes(rate=100.0)
    due.fill_backlog(overdue(50))
    due.take(0.0, 10, live_only=False)  # spends the bucket: the next chunk in 0.05 s
    due.fill_live([entry(1.0)])
    assert due.next_wake_s(0.0, live_only=False) == pytest.approx(0.05)
    assert due.next_wake_s(0.0, live_only=True) == pytest.approx(1.0 - CLAIM_LEAD_S)
    due.fill_live([entry(0.02)])
    # It claims nothing ahead while it holds overdue jobs: it wakes when the live job is due.
    assert due.next_wake_s(0.0, live_only=False) == pytest.approx(0.02)


def test_retain_drops_lost_shards_from_every_lane() -> None:
    due = lanes()
    due.fill_live([entry(NOW - 1.0, shard=n % 2) for n in range(6)])
    due.fill_backlog([entry(NOW - 90.0, shard=n % 2) for n in range(6)])
    due.recover([entry(NOW - 50.0, shard=n % 2) for n in range(6)])
    due.retain(lambda e: e.shard == 0)
    assert (due.live_count, due.backlog_count, due.recovery_count) == (3, 3, 3)
    assert all(e.shard == 0 for e in due.take(NOW, 100, live_only=False))


def test_demote_drops_the_late_live_entries_and_counts_them() -> None:
    due = lanes()
    due.fill_live([entry(float(t)) for t in range(10)])
    assert due.demote(0.0) is None
    assert due.demote(4.0) == Demoted(earliest_s=0.0, count=4)
    assert due.demote(6.0) == Demoted(earliest_s=4.0, count=2)
    assert due.demoted == 6
    assert (due.live_count, due.next_live_s()) == (4, 6.0)


def test_trim_live_keeps_the_earliest_and_names_the_last_kept() -> None:
    due = lanes()
    due.fill_live([entry(float(t)) for t in range(10, 0, -1)])
    assert due.trim_live(10) is None
    kept = due.trim_live(4)
    assert kept is not None
    assert kept.run_at_s == 4.0
    assert [e.run_at_s for e in due.take(100.0, 10, live_only=False)] == [1.0, 2.0, 3.0, 4.0]


def test_the_loader_hears_of_every_batch_taken_and_of_nothing_else() -> None:
    due = lanes()
    taken: list[int] = []
    due.when_taken(lambda: taken.append(due.live_count))
    due.fill_live([entry(NOW - 1.0), entry(NOW + 60.0)])
    due.take(NOW, 10, live_only=False)
    assert taken == [1]
    due.take(NOW, 10, live_only=False)  # nothing due: nothing taken
    due.take(NOW, 10, live_only=True)
    assert taken == [1]
