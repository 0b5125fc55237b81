"""The stats snapshot: at most N routing keys by name over every state, the rest of each state
summed, totals exact."""

from datetime import UTC, datetime

from dispatcher.store.history import StateCount
from dispatcher.upkeep.housekeeping import Count, summarise

AT = datetime(2030, 1, 1, tzinfo=UTC)


def state(name: str, by_key: dict[str, int], other_jobs: int = 0) -> StateCount:
    return StateCount(state=name, by_key=by_key, other_jobs=other_jobs, counted_at=AT)


def test_the_keys_with_most_jobs_over_every_state_are_named_and_the_rest_summed() -> None:
    snapshot = summarise(
        [
            state("scheduled", {"a": 5, "b": 4, "c": 1}, other_jobs=7),
            state("succeeded", {"c": 9, "d": 2}),
        ],
        routing_keys=2,
    )
    # c has 10 jobs in all, a 5, b 4, d 2: c and a are named, in every state they have jobs in.
    assert snapshot.counts == [
        Count(state="scheduled", routing_key="a", jobs=5),
        Count(state="scheduled", routing_key="c", jobs=1),
        Count(state="succeeded", routing_key="c", jobs=9),
    ]
    assert snapshot.other == {"scheduled": 4 + 7, "succeeded": 2}
    assert snapshot.by_state["scheduled"] == 17
    assert snapshot.by_state["succeeded"] == 11
    assert snapshot.by_state["dead"] == 0  # not counted yet: zero
    assert snapshot.counted_at == {"scheduled": AT, "succeeded": AT}


def test_many_keys_stay_within_the_bound_and_ties_go_by_name() -> None:
    snapshot = summarise([state("scheduled", {f"k.{i:03}": 1 for i in range(500)})], 50)
    assert [count.routing_key for count in snapshot.counts] == [f"k.{i:03}" for i in range(50)]
    assert snapshot.other == {"scheduled": 450}
