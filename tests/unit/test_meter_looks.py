"""What the flow meter looks for, and from where (``flow.looks``), without I/O."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from dispatcher.flow import looks
from dispatcher.flow.looks import BEGINNING, MeterLooks
from dispatcher.flow.rules import Limits, Rule, RuleBook
from dispatcher.models import DueEntry

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RATED = Rule(key="a", namespace=None, limits=Limits(rate_per_s=10.0, burst=3), updated_at=NOW)
SLOTS = Limits(max_in_flight=2, in_flight_timeout_s=9.0)
OTHER = Rule(key="b.c", namespace="shop", limits=SLOTS, updated_at=NOW)
TAGS = RuleBook([RATED, OTHER]).governing_tags([RATED, OTHER], NOW)
SHARDS = frozenset({1, 2})


def entry(at: datetime, key: str = "a.x") -> DueEntry:
    return DueEntry.make(at.timestamp(), uuid.uuid4(), 1, key)


def started(now_mono: float = 0.0) -> MeterLooks:
    meter = MeterLooks()
    assert meter.start(SHARDS, [RATED, OTHER], TAGS, now_mono)
    return meter


def test_nothing_to_meter_without_a_metered_rule_or_a_shard() -> None:
    meter = MeterLooks()
    assert not meter.start(SHARDS, [], TAGS, 0.0)
    assert not meter.start(frozenset(), [RATED], TAGS, 0.0)


def test_a_start_walks_the_whole_index_for_every_rule_and_wakes_those_with_jobs() -> None:
    meter = started()
    assert meter.looks() == []  # every rule quiet until the walk says otherwise
    assert meter.walk_from(0.0) == BEGINNING
    assert meter.quiet_first_words == ["a", "b"]
    meter.walked(BEGINNING, NOW, {1})
    [look] = meter.looks()
    assert (look.rule, look.tag, look.floor, look.wanted) == (OTHER, 1, BEGINNING, 2)
    assert meter.quiet_first_words == ["a"]
    # The next walk starts where this one ended (less the margin), once QUIET_S has passed.
    assert meter.walk_from(looks.QUIET_S / 2) is None
    assert meter.walk_from(looks.QUIET_S) == NOW - looks.QUIET_MARGIN


def test_a_busy_rule_looks_from_its_oldest_job_and_never_asks_twice_for_one_let_go() -> None:
    meter = started()
    meter.walked(BEGINNING, NOW, {0})
    [look] = meter.looks()
    jobs = [entry(NOW - timedelta(seconds=10 - n)) for n in range(5)]
    asked = meter.found(look, jobs, NOW)
    assert asked == jobs[:3]  # a burst's worth
    meter.granted(look, asked[:2], now_mono=1.0)
    meter.start(SHARDS, [RATED, OTHER], TAGS, 2.0)
    [look] = meter.looks()
    assert look.floor == datetime.fromtimestamp(jobs[0].run_at_s, UTC)
    assert look.wanted == 3 + 2  # room for the two let go and not yet claimed
    assert meter.found(look, jobs, NOW) == jobs[2:5]
    # Let go PENDING_S ago and still found (never claimed): asked for again.
    meter.start(SHARDS, [RATED, OTHER], TAGS, 1.0 + looks.PENDING_S)
    [look] = meter.looks()
    assert meter.found(look, jobs, NOW) == jobs[:3]


def test_a_rule_that_finds_nothing_is_quiet_and_the_walk_takes_it_from_then() -> None:
    meter = started()
    meter.walked(BEGINNING, NOW, {0})
    meter.walk_from(0.0)
    later = NOW + timedelta(minutes=1)
    meter.walked(NOW, later, set())
    [look] = meter.looks()
    assert meter.found(look, [], NOW + timedelta(seconds=5)) == []
    assert meter.looks() == []
    assert meter.walk_from(1.0) == NOW + timedelta(seconds=5) - looks.QUIET_MARGIN


def test_a_job_stored_behind_the_walk_moves_it_back_at_once() -> None:
    meter = started()
    meter.walk_from(0.0)
    meter.walked(BEGINNING, NOW, set())
    assert meter.walk_from(0.01) is None
    meter.offered([entry(NOW - timedelta(hours=1), key="z.other")])  # no metered rule's
    assert meter.walk_from(0.02) is None
    behind = NOW - timedelta(hours=1)
    meter.offered([entry(behind, key="a.deep.key")])
    assert meter.walk_from(0.03) == behind - looks.QUIET_MARGIN
    meter.offered([entry(behind - timedelta(hours=1), key="")])  # unknown key: may be metered
    assert meter.walk_from(0.04) == behind - timedelta(hours=1) - looks.QUIET_MARGIN


def test_a_job_stored_behind_a_walk_under_way_is_walked_to_by_the_next_one_at_once() -> None:
    """Offered after the walk's query began (its snapshot may not hold the job), the job is not
    passed over by where that walk ends."""
    meter = started()
    meter.walk_from(0.0)
    meter.walked(BEGINNING, NOW, set())
    since = meter.walk_from(1.0)
    behind = NOW - timedelta(hours=1)
    meter.offered([entry(behind, key="a.deep.key")])  # while that walk's query runs
    meter.walked(since or BEGINNING, NOW + timedelta(seconds=1), set())
    assert meter.walk_from(1.01) == behind - looks.QUIET_MARGIN
    meter.walked(behind, NOW + timedelta(seconds=2), set())
    assert meter.walk_from(1.2) == NOW + timedelta(seconds=2) - looks.QUIET_MARGIN  # once


def test_a_change_of_rules_or_shards_and_the_rescan_start_a_whole_walk() -> None:
    meter = started()
    meter.walk_from(0.0)
    meter.walked(BEGINNING, NOW, {0, 1})
    assert len(meter.looks()) == 2
    assert meter.start(SHARDS, [RATED], TAGS, 1.0)  # a rule gone
    assert meter.looks() == []
    assert meter.walk_from(1.0) == BEGINNING
    meter.walked(BEGINNING, NOW, {0})
    assert meter.start(frozenset({1}), [RATED], TAGS, 2.0)  # a shard lost
    assert meter.looks() == []
    meter.walk_from(2.0)
    meter.walked(BEGINNING, NOW, {0})
    assert meter.start(frozenset({1}), [RATED], TAGS, 2.0 + looks.RESCAN_S)
    assert meter.looks() == []
    assert meter.walk_from(2.0 + looks.RESCAN_S) == BEGINNING


def test_tags_changed_alone_start_a_whole_walk() -> None:
    meter = started()
    metered = [RATED, OTHER]
    assert meter.start(SHARDS, metered, TAGS, 0.0)
    meter.walk_from(0.0)
    meter.walked(BEGINNING, NOW, {0, 1})
    assert meter.start(SHARDS, metered, TAGS, 1.0)  # the same rules, the same tags
    assert len(meter.looks()) == 2
    # A rule below a metered one paused (the metered rules themselves unchanged): its jobs are no
    # longer the meter's, and the walk starts afresh.
    paused_below = Rule(key="a.x", namespace=None, limits=Limits(paused=True), updated_at=NOW)
    tags = RuleBook([RATED, OTHER, paused_below]).governing_tags(metered, NOW)
    assert tags != TAGS
    assert meter.start(SHARDS, metered, tags, 2.0)
    assert meter.looks() == []
    assert meter.walk_from(2.0) == BEGINNING
