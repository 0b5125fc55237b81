"""Sticky, balanced assignment of shards to members. Pure: no I/O, deterministic.

Every member gets floor(S/N) or ceil(S/N) shards. A shard moves only when its owner left or holds
more than its quota; the members that already hold the most are the ones allowed the extra shard,
so a join or a leave moves the fewest shards it can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatcher.health import Standing


def assign(
    members: Sequence[str], shard_count: int, previous: Mapping[str, Sequence[int]]
) -> dict[str, list[int]]:
    """The new assignment: member -> sorted shards. Empty when there are no members."""
    live = sorted(set(members))
    if not live:
        return {}
    base, extra = divmod(shard_count, len(live))
    held = {member: _valid(previous.get(member, ()), shard_count) for member in live}
    # The ``extra`` members allowed ceil(S/N) are those holding the most already (ties by name).
    by_holding = sorted(live, key=lambda member: (-len(held[member]), member))
    quota = {member: base + (1 if rank < extra else 0) for rank, member in enumerate(by_holding)}

    result: dict[str, list[int]] = {}
    taken: set[int] = set()
    for member in live:
        keep = [shard for shard in held[member] if shard not in taken][: quota[member]]
        taken.update(keep)
        result[member] = keep
    free = iter(shard for shard in range(shard_count) if shard not in taken)
    for member in live:
        while len(result[member]) < quota[member]:
            result[member].append(next(free))
    return {member: sorted(shards) for member, shards in result.items()}


def _valid(shards: Sequence[int], shard_count: int) -> list[int]:
    return sorted({shard for shard in shards if 0 <= shard < shard_count})


def moved(before: Mapping[str, Sequence[int]], after: Mapping[str, Sequence[int]]) -> int:
    """How many shards changed owner between two assignments."""
    owner_before = {shard: member for member, shards in before.items() for shard in shards}
    owner_after = {shard: member for member, shards in after.items() for shard in shards}
    return sum(1 for shard, member in owner_after.items() if owner_before.get(shard) != member)


# The standings of a member that asked for its shards to go to the others.
AWAY = frozenset({Standing.OUT, Standing.RECOVERING})


def eligible(
    members: Sequence[str],
    standings: Mapping[str, str],
    well_for_s: Mapping[str, float],
    settle_s: float,
) -> list[str]:
    """The members the assignment deals shards to.

    STANDINGS: each member's reported standing (a member not in it is well); WELL_FOR_S: how long
    each has been seen well. A member that stepped out (or waits to rejoin) gets no shard, but
    only while another member has been well for SETTLE_S: when a service is down for every node,
    all of them step out and the shards stay where they are, rather than go round the nodes as
    each notices a moment apart."""
    away = {member for member in members if standings.get(member) in AWAY}
    if not away:
        return list(members)
    steady = [
        member
        for member in members
        if member not in standings and well_for_s.get(member, 0.0) >= settle_s
    ]
    if not steady:
        return list(members)
    return [member for member in members if member not in away]
