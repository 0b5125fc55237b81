"""Due notices as the dispatcher reads them from PostgreSQL's NOTIFY payloads."""

from dispatcher.store.due_notices import parse


def test_due_notices_parse_and_odd_ones_are_ignored() -> None:
    entry = parse("0190a0c6-4c7a-7000-8000-000000000001,12,1795000000.123456,orders.x")
    assert entry is not None
    assert (entry.shard, entry.run_at_s, entry.key) == (12, 1795000000.123456, "orders.x")
    bare = parse("0190a0c6-4c7a-7000-8000-000000000001,3,17.5")
    assert bare is not None
    assert bare.key == ""
    for odd in ("", "x,1,2", "0190a0c6-4c7a-7000-8000-000000000001,a,1", "1,2,3,4,5"):
        assert parse(odd) is None


ID = "0190a0c6-4c7a-7000-8000-000000000001"


def test_a_notice_any_database_role_could_send_is_refused_unless_it_holds() -> None:
    """Any role on the database may NOTIFY this channel: what reaches the heap must be a time
    PostgreSQL and Python both carry, a shard of the cluster and a routing key."""
    for forged in (
        f"{ID},1,nan",
        f"{ID},1,inf",
        f"{ID},1,-inf",
        f"{ID},1,1e300",
        f"{ID},1,-62135596801",  # a second before 0001-01-01
        f"{ID},1,253402300800",  # 10000-01-01
        f"{ID},-1,17.5",
        f"{ID},8,17.5",  # no shard 8 of 8
        f"{ID},1,17.5,orders.#",
        f"{ID},1,17.5,orders.x\n",
    ):
        assert parse(forged, shard_count=8) is None, forged
    kept = parse(f"{ID},7,253402300799,orders.x", shard_count=8)
    assert kept is not None
    assert (kept.shard, kept.run_at_s) == (7, 253402300799.0)
