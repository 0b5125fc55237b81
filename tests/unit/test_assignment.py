import math
import random

import pytest

from dispatcher.cluster.assignment import assign, eligible, moved

SHARDS = 256


def check_valid(result: dict[str, list[int]], members: list[str], shard_count: int) -> None:
    owners = [shard for shards in result.values() for shard in shards]
    assert sorted(owners) == list(range(shard_count)), "every shard owned exactly once"
    assert set(result) == set(members)
    ceiling = math.ceil(shard_count / len(members))
    assert all(shard_count // len(members) <= len(s) <= ceiling for s in result.values())


def test_first_assignment_is_balanced() -> None:
    result = assign(["a", "b", "c"], SHARDS, {})
    check_valid(result, ["a", "b", "c"], SHARDS)


def test_no_members_no_assignment() -> None:
    assert assign([], SHARDS, {"a": [1, 2]}) == {}


def test_unchanged_membership_moves_nothing() -> None:
    first = assign(["a", "b", "c"], SHARDS, {})
    assert assign(["c", "a", "b"], SHARDS, first) == first


def test_a_join_moves_only_what_the_newcomer_takes() -> None:
    before = assign(["a", "b", "c"], SHARDS, {})
    after = assign(["a", "b", "c", "d"], SHARDS, before)
    check_valid(after, ["a", "b", "c", "d"], SHARDS)
    assert moved(before, after) == len(after["d"]) == SHARDS // 4
    for member in "abc":
        assert set(after[member]) <= set(before[member]), "old members only give shards away"


def test_a_leave_moves_only_the_leavers_shards() -> None:
    before = assign(["a", "b", "c", "d"], SHARDS, {})
    after = assign(["a", "b", "c"], SHARDS, before)
    check_valid(after, ["a", "b", "c"], SHARDS)
    assert moved(before, after) == len(before["d"])
    for member in "abc":
        assert set(before[member]) <= set(after[member]), "survivors keep what they had"


def test_garbage_in_the_previous_assignment_is_ignored() -> None:
    result = assign(["a", "b"], 8, {"a": [0, 1, 99, -1, 1], "b": [1, 2], "gone": [3]})
    check_valid(result, ["a", "b"], 8)
    assert {0, 1} <= set(result["a"])


@pytest.mark.parametrize("seed", range(20))
def test_random_join_leave_sequences_stay_balanced_and_move_little(seed: int) -> None:
    rng = random.Random(seed)
    shard_count = rng.choice([7, 64, 256, 1000])
    pool = [f"n{i}" for i in range(12)]
    members = rng.sample(pool, rng.randint(1, 5))
    current = assign(members, shard_count, {})
    for _ in range(30):
        previous_members = list(members)
        if len(members) > 1 and rng.random() < 0.5:
            members.remove(rng.choice(members))
        else:
            candidates = [m for m in pool if m not in members]
            if candidates:
                members.append(rng.choice(candidates))
        result = assign(members, shard_count, current)
        check_valid(result, members, shard_count)
        # Minimal movement: what a leaver held must move; beyond that only what balance needs.
        leavers = set(previous_members) - set(members)
        forced = sum(len(current[m]) for m in leavers)
        ceiling = math.ceil(shard_count / len(members))
        floor = shard_count // len(members)
        excess = sum(max(0, len(current[m]) - ceiling) for m in members if m in current)
        joiners_need = sum(floor for m in members if m not in current)
        assert moved(current, result) <= max(forced, joiners_need) + excess + len(members)
        current = result


# --- who gets shards while nodes step out (``eligible``) -----------------------------------------

MEMBERS = ["n0", "n1", "n2"]
SETTLE = 10.0
LONG_WELL = {"n0": 60.0, "n1": 60.0, "n2": 60.0}


def test_with_every_member_well_every_member_gets_shards() -> None:
    assert eligible(MEMBERS, {}, LONG_WELL, SETTLE) == MEMBERS


def test_a_member_that_stepped_out_gets_none_while_others_are_well() -> None:
    standings = {"n1": "out"}
    assert eligible(MEMBERS, standings, LONG_WELL, SETTLE) == ["n0", "n2"]
    dealt = assign(eligible(MEMBERS, standings, LONG_WELL, SETTLE), 30, assign(MEMBERS, 30, {}))
    assert set(dealt) == {"n0", "n2"}
    assert sorted(dealt["n0"] + dealt["n2"]) == list(range(30))


def test_a_member_waiting_to_rejoin_gets_none_either() -> None:
    assert eligible(MEMBERS, {"n2": "recovering"}, LONG_WELL, SETTLE) == ["n0", "n1"]


def test_a_failing_member_under_the_bound_keeps_its_shards() -> None:
    assert eligible(MEMBERS, {"n1": "failing"}, LONG_WELL, SETTLE) == MEMBERS


def test_when_nobody_has_been_well_long_enough_the_shards_stay_where_they_are() -> None:
    # The service is down for everyone: each node steps out a moment after the other.
    assert eligible(MEMBERS, {"n0": "out", "n1": "failing", "n2": "failing"}, {}, SETTLE) == MEMBERS
    assert eligible(MEMBERS, {"n0": "out", "n1": "out", "n2": "out"}, {}, SETTLE) == MEMBERS
    # Back: the first well again is not steady yet when the others come back too.
    recent = {"n0": 1.0}
    assert eligible(MEMBERS, {"n1": "out", "n2": "out"}, recent, SETTLE) == MEMBERS


def test_a_member_well_for_the_settle_time_takes_the_shards_of_those_out() -> None:
    well = {"n0": SETTLE}
    assert eligible(MEMBERS, {"n1": "out", "n2": "out"}, well, SETTLE) == ["n0"]
