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
