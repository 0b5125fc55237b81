"""Firing's batch writer: a batch of publishes framed as one write on an aiormq channel.

aiormq publishes one message per call: a lock, a timeout scope, a task and a socket write each,
which took more CPU than the rest of firing together (py-spy); framing a batch as one write fired
1.5x faster. aiormq has no public way to do that, so ``Frames`` uses the channel's private state:
its ``lock``, ``delivery_tag`` counter, ``confirmations`` map and ``write_queue`` (with
``aiormq.abc.ChannelFrame``). A patch release may change any of them without notice, so
``supported`` checks the installed version against the range tested here and the attributes
before the publisher uses this path; otherwise it publishes message by message.

What a public batch publish in aiormq would need (a proposal in upstream terms)::

    async def basic_publish_many(
        self,
        messages: Sequence[tuple[str, str, bytes, spec.Basic.Properties]],  # exchange, rk, body
        *, mandatory: bool = False, timeout: TimeoutType = None,
    ) -> list[asyncio.Future[ConfirmationFrameType | None]]:

- marshal every message first (an encoding error raises before anything is sent, naming the
  message's index), then under the channel's lock take consecutive delivery tags, register one
  confirmation future per tag and hand all frames to the writer as one ``ChannelFrame``;
- give the tags back if the frame never reached the writer (cancellation, closed channel), as
  ``basic_publish`` does for one message;
- return the futures without awaiting them: each resolves as ``basic_publish`` would (ack, nack
  as ``DeliveryError``, a returned message when mandatory, the channel's close as its exception),
  so a caller pipelines the confirms of the whole batch;
- with ``publisher_confirms`` off, return futures already resolved to ``None`` once written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

import aiormq
import pamqp.constants
import pamqp.frame
import pamqp.header
from aiormq.abc import ChannelFrame

from dispatcher import models

# The aiormq releases this module was tested with, both ends included: the publisher's
# integration tests ran on 7.2.4 (the pin in pyproject.toml allows <8, for the per-message path).
TESTED_AIORMQ = ((7, 2, 4), (7, 2, 4))
# The channel state ``Frames`` reads and writes, with the type it relies on.
CHANNEL_STATE: dict[str, type | tuple[type, ...]] = {
    "lock": contextlib.AbstractAsyncContextManager,  # a property: a fresh context each time
    "delivery_tag": int,
    "confirmations": dict,
    "write_queue": asyncio.Queue,
    "number": int,
    "max_content_size": int,
}
MAX_CACHED_ROUTES = 10_000  # Basic.Publish frames kept, one per routing key
_BODY_FRAME_HEADER = struct.Struct(">BHI")  # frame type, channel, size

Properties = Callable[[models.Claimed], aiormq.spec.Basic.Properties]


def supported(channel: object, *, aiormq_version: str | None = None) -> str | None:
    """None when ``Frames`` can run on this channel, else the reason it cannot.

    ``aiormq_version`` defaults to the installed distribution's (importlib.metadata)."""
    version = metadata.version("aiormq") if aiormq_version is None else aiormq_version
    try:
        parsed = tuple(int(part) for part in version.split("."))
    except ValueError:
        parsed = None
    low, high = TESTED_AIORMQ
    if parsed is None or not low <= parsed <= high:
        tested = ".".join(map(str, low)) + " to " + ".".join(map(str, high))
        return f"aiormq {version} is outside the range tested for framed batches ({tested})"
    fields = (
        {f.name for f in dataclasses.fields(ChannelFrame)}
        if dataclasses.is_dataclass(ChannelFrame)
        else set()
    )
    if not {"payload", "should_close"} <= fields:
        return "aiormq.abc.ChannelFrame has no payload/should_close fields"
    for name, kind in CHANNEL_STATE.items():
        if not isinstance(getattr(channel, name, None), kind):
            return f"aiormq's channel has no {name} attribute of the expected type"
    if not callable(getattr(channel, "create_future", None)):
        return "aiormq's channel has no create_future method"
    if getattr(channel, "publisher_confirms", False) is not True:
        return "the channel does not use publisher confirms"
    return None


def unencodable(exc: Exception) -> str:
    """The reason a job is parked when its message cannot be encoded (either path)."""
    return f"cannot be encoded as an AMQP message: {exc!r}"


@dataclass(slots=True)
class Framed:
    """A batch framed for one write: the jobs it holds, in delivery-tag order."""

    payload: bytes
    jobs: list[models.Claimed]
    unpublishable: list[tuple[models.Claimed, str]]


class Frames:
    """Frames a batch of publishes on one aiormq channel as one write.

    It keeps aiormq's own bookkeeping: under the channel's lock each message takes the next
    delivery tag and a confirmation future registered where the channel's reader resolves it
    (ack, nack, or the channel's close rejecting it). A write that never reached the writer's
    queue gives its tags back, as ``Channel.basic_publish`` does, so the broker's count of
    publishes and ours stay the same.
    """

    def __init__(self, channel: aiormq.Channel, exchange: str) -> None:
        self.channel = channel
        self._exchange = exchange
        self._publish_frames: dict[str, bytes] = {}  # routing key -> its Basic.Publish frame
        self._max_body = channel.max_content_size

    def _publish_frame(self, routing_key: str) -> bytes:
        frame = self._publish_frames.get(routing_key)
        if frame is None:
            if len(self._publish_frames) > MAX_CACHED_ROUTES:
                self._publish_frames.clear()
            method = aiormq.spec.Basic.Publish(exchange=self._exchange, routing_key=routing_key)
            frame = self._publish_frames[routing_key] = pamqp.frame.marshal(
                method, self.channel.number
            )
        return frame

    def _body_frames(self, body: bytes) -> list[bytes]:
        number = self.channel.number
        return [
            _BODY_FRAME_HEADER.pack(pamqp.constants.FRAME_BODY, number, len(chunk))
            + chunk
            + pamqp.constants.FRAME_END_CHAR
            for chunk in (
                body[at : at + self._max_body] for at in range(0, len(body), self._max_body)
            )
        ]

    def frame(self, jobs: Sequence[models.Claimed], properties: Properties) -> Framed:
        """Each job's frames, joined; a job whose message cannot be encoded is left out (one
        such job must not stop its batch, or every batch it is retried in)."""
        number = self.channel.number
        parts: list[bytes] = []
        framed: list[models.Claimed] = []
        unpublishable: list[tuple[models.Claimed, str]] = []
        for job in jobs:
            try:
                header = pamqp.header.ContentHeader(
                    body_size=len(job.payload), properties=properties(job)
                )
                frames = [
                    self._publish_frame(job.routing_key),
                    pamqp.frame.marshal(header, number),
                    *self._body_frames(job.payload),
                ]
            except Exception as exc:
                unpublishable.append((job, unencodable(exc)))
                continue
            parts.extend(frames)
            framed.append(job)
        return Framed(b"".join(parts), framed, unpublishable)

    async def send(self, framed: Framed) -> list[asyncio.Future[object]]:
        if not framed.jobs:
            return []
        channel = self.channel
        frame = ChannelFrame(payload=framed.payload, should_close=False)
        count = len(framed.jobs)
        async with channel.lock:
            first_tag = channel.delivery_tag + 1
            confirmations: list[asyncio.Future[object]] = []
            for tag in range(first_tag, first_tag + count):
                future = channel.create_future()
                channel.confirmations[tag] = future
                confirmations.append(future)
            channel.delivery_tag += count
            try:
                await channel.write_queue.put(frame)
            except BaseException:
                # Not handed to the writer: the broker never sees these tags.
                channel.delivery_tag -= count
                for tag, future in enumerate(confirmations, start=first_tag):
                    channel.confirmations.pop(tag, None)
                    future.cancel()
                raise
        return confirmations
