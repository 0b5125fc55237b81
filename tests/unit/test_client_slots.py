"""Each client address holds at most its share of the connection slots; an IPv6 client counts
by its /64 and an IPv4-mapped address as its IPv4 one; a slot given back may be taken again."""

from __future__ import annotations

from dispatcher.api.client_slots import ClientSlots, client_of


def test_a_client_past_its_share_is_refused_while_another_takes_slots() -> None:
    slots = ClientSlots(2)
    assert [slots.take("127.0.0.1") for _ in range(3)] == [True, True, False]
    assert slots.held("127.0.0.1") == 2  # the refused one was not counted
    assert slots.take("127.0.0.2")
    slots.give_back("127.0.0.1")
    assert slots.take("127.0.0.1")
    assert not slots.take("127.0.0.1")


def test_a_client_that_gave_every_slot_back_is_forgotten() -> None:
    slots = ClientSlots(3)
    for _ in range(3):
        slots.take("192.0.2.7")
    for _ in range(3):
        slots.give_back("192.0.2.7")
    assert slots.held("192.0.2.7") == 0
    assert len(slots) == 0  # nothing kept for the addresses that came and went


def test_a_client_is_its_ipv4_address_or_its_ipv6_64() -> None:
    assert client_of(("127.0.0.1", 50_000)) == "127.0.0.1"
    assert client_of(("127.0.0.2", 50_001)) == "127.0.0.2"
    one_host = {client_of((f"2001:db8:1:2::{n:x}", 443, 0, 0)) for n in range(1, 50)}
    assert one_host == {"2001:db8:1:2::/64"}
    assert client_of(("2001:db8:1:3::1", 443, 0, 0)) != client_of(("2001:db8:1:2::1", 443, 0, 0))
    assert client_of(("::ffff:192.0.2.7", 80, 0, 0)) == "192.0.2.7"
    assert client_of(("fe80::1%eth0", 80, 0, 2)) == "fe80::/64"
    assert client_of(("::1", 80, 0, 0)) == "::/64"


def test_connections_whose_address_is_unknown_share_one_client() -> None:
    assert client_of(None) == client_of("/run/dispatcher.sock") == client_of(()) == "unknown"
