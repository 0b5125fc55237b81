"""The ack frames of a channel's deliveries: one multiple ack for the settled oldest ones, and
never a frame that covers a delivery still running or one nacked by its own frame."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from consumers_sdk.acks import AckWindow


def window(*tags: int) -> AckWindow:
    acks = AckWindow()
    for tag in tags:
        acks.delivered(tag)
    return acks


def test_acks_of_the_oldest_deliveries_are_one_multiple_ack() -> None:
    acks = window(1, 2, 3, 4)
    for tag in (2, 1, 3):
        acks.acked(tag)
    assert acks.frames() == [(3, True)]
    assert acks.frames() == []  # nothing new
    acks.acked(4)
    assert acks.frames() == [(4, True)]
    assert len(acks) == 0


def test_an_ack_behind_a_running_delivery_is_sent_alone_at_once() -> None:
    acks = window(1, 2, 3)
    acks.acked(2)
    acks.acked(3)
    assert acks.frames() == [(2, False), (3, False)]  # 1 still runs: not covered
    acks.acked(1)
    assert acks.frames() == [(1, True)]  # 2 and 3 are settled already


def test_a_multiple_ack_passes_over_a_nacked_delivery_but_never_ends_on_it() -> None:
    acks = window(1, 2, 3)
    acks.settled(3)  # nacked by its own frame
    assert acks.frames() == []
    acks.acked(1)
    acks.settled(2)
    assert acks.frames() == [(1, True)]
    assert len(acks) == 0


def test_an_ack_of_an_unknown_or_settled_delivery_sends_nothing() -> None:
    acks = window(5)
    acks.acked(9)
    acks.settled(5)
    acks.acked(5)
    assert acks.frames() == []


def test_a_delivery_registered_out_of_order_is_still_never_covered() -> None:
    acks = window(1, 3)
    acks.delivered(2)
    acks.acked(1)
    acks.acked(3)
    assert acks.frames() == [(1, True), (3, False)]


@given(st.integers(min_value=1, max_value=60), st.randoms(use_true_random=False))
def test_every_ack_is_sent_once_and_no_frame_covers_a_running_or_nacked_delivery(
    count: int, rng: random.Random
) -> None:
    acks = window(*range(1, count + 1))
    running = set(range(1, count + 1))
    acked: set[int] = set()
    nacked: set[int] = set()
    settled_at_broker: set[int] = set()
    for tag in rng.sample(sorted(running), k=count):
        running.discard(tag)
        if rng.random() < 0.2:
            nacked.add(tag)
            settled_at_broker.add(tag)
            acks.settled(tag)
        else:
            acked.add(tag)
            acks.acked(tag)
        if rng.random() < 0.5:
            for frame_tag, multiple in acks.frames():
                covers = (
                    {t for t in range(1, frame_tag + 1) if t not in settled_at_broker}
                    if multiple
                    else {frame_tag}
                )
                assert frame_tag in acked
                assert frame_tag not in settled_at_broker
                assert covers <= acked, (covers, running, nacked)
                settled_at_broker |= covers
    for frame_tag, multiple in acks.frames():
        covers = (
            {t for t in range(1, frame_tag + 1) if t not in settled_at_broker}
            if multiple
            else {frame_tag}
        )
        assert covers <= acked
        settled_at_broker |= covers
    assert settled_at_broker == acked | nacked
    assert len(acks) == 0
