"""Acks in batches: the deliveries a consumer acked during one turn of the event loop are settled
by as few frames as the broker allows.

Delivery tags grow along a channel, and an ack with ``multiple`` settles every delivery of the
channel up to its tag. So ``AckWindow`` keeps the channel's deliveries in tag order: once the oldest
ones are all settled, one multiple ack covers those acked among them; one acked behind a delivery
still running is acked alone, at once, so a slow handler never keeps the others counted against the
prefetch. A delivery nacked by its own frame counts as settled once that frame is queued: a later
multiple ack passes over it, since the broker no longer counts it as outstanding.

``ChannelAcks`` sends the frames at the end of the loop turn without waiting for the socket to
drain; an ack that cannot be sent (the channel is gone) is logged, and the broker redelivers the
delivery, as it would any unacked one.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections import deque

import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage

logger = logging.getLogger(__name__)

_RUNNING, _ACKED, _SETTLED = 0, 1, 2


class AckWindow:
    """Which ack frames settle what was acked so far, as ``(delivery tag, multiple)``. Pure: every
    delivery of the channel must pass ``delivered`` first, or a multiple ack could cover it."""

    def __init__(self) -> None:
        self._tags: deque[int] = deque()  # undecided or not yet covered, in tag order
        self._state: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._tags)

    def delivered(self, tag: int) -> None:
        if not self._tags or tag > self._tags[-1]:
            self._tags.append(tag)
        else:  # not expected (deliveries arrive in order), but never cover it by mistake
            bisect.insort(self._tags, tag)
        self._state[tag] = _RUNNING

    def acked(self, tag: int) -> None:
        if self._state.get(tag) == _RUNNING:
            self._state[tag] = _ACKED

    def settled(self, tag: int) -> None:
        """Settled by a frame of its own (nack, reject) that is queued already."""
        if tag in self._state:
            self._state[tag] = _SETTLED

    def frames(self) -> list[tuple[int, bool]]:
        frames: list[tuple[int, bool]] = []
        covered: int | None = None
        while self._tags and self._state[self._tags[0]] != _RUNNING:
            tag = self._tags.popleft()
            if self._state.pop(tag) == _ACKED:
                covered = tag
        if covered is not None:
            frames.append((covered, True))
        for tag in self._tags:  # behind one still running: alone, now
            if self._state[tag] == _ACKED:
                frames.append((tag, False))
                self._state[tag] = _SETTLED
        return frames


class ChannelAcks:
    """The acks of one channel's deliveries, flushed once per loop turn."""

    def __init__(self, channel: aiormq.abc.AbstractChannel) -> None:
        self.channel = channel
        self._window = AckWindow()
        self._flush_soon: asyncio.Handle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def delivered(self, tag: int) -> None:
        self._window.delivered(tag)

    def ack(self, tag: int) -> None:
        self._window.acked(tag)
        self._schedule()

    def settled(self, tag: int) -> None:
        self._window.settled(tag)
        self._schedule()

    def _schedule(self) -> None:
        if self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = None
        frames = self._window.frames()
        if frames:
            task = asyncio.create_task(self._send(frames), name="acks")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, frames: list[tuple[int, bool]]) -> None:
        try:
            for tag, multiple in frames:
                await self.channel.basic_ack(tag, multiple=multiple, wait=False)
        except Exception as exc:
            logger.info("deliveries not acked (channel gone, they will be redelivered): %r", exc)

    async def drained(self) -> None:
        """Once every ack asked for so far is queued on the channel."""
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush()
        if self._sending:
            await asyncio.wait(set(self._sending))


class Acks:
    """A consumer's acks, by channel: a reconnect brings a new channel, with tags from 1 again."""

    def __init__(self) -> None:
        self._channels: dict[int, ChannelAcks] = {}

    def _of(self, message: AbstractIncomingMessage) -> ChannelAcks:
        channel = message.channel
        acks = self._channels.get(id(channel))
        if acks is None or acks.channel is not channel:
            for key, old in list(self._channels.items()):  # channels closed by a reconnect
                if old.channel.is_closed:
                    del self._channels[key]
            acks = self._channels[id(channel)] = ChannelAcks(channel)
        return acks

    def delivered(self, message: AbstractIncomingMessage) -> None:
        if message.delivery_tag is not None:
            self._of(message).delivered(message.delivery_tag)

    def ack(self, message: AbstractIncomingMessage) -> None:
        """Ack at the end of this loop turn, with the others acked meanwhile."""
        if message.delivery_tag is not None:
            self._of(message).ack(message.delivery_tag)

    async def nack(self, message: AbstractIncomingMessage) -> None:
        """Hand the delivery back (requeued) now; tolerates a channel that is gone."""
        try:
            await message.nack(requeue=True)
        except Exception as exc:
            logger.info("delivery not settled (channel gone, it will be redelivered): %r", exc)
        if message.delivery_tag is not None:
            self._of(message).settled(message.delivery_tag)

    async def drained(self) -> None:
        for acks in list(self._channels.values()):
            with contextlib.suppress(Exception):
                await acks.drained()
