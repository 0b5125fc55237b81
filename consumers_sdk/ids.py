"""Job ids and the shard an id hashes to, shared by the dispatcher and ``enqueue``; the random ids
of outcome events. Pure but for ``os.urandom``."""

from __future__ import annotations

import os
import time
import uuid
import zlib
from collections.abc import Callable, Sequence

RANDOM_BLOCK = 4096  # bytes of randomness drawn at once: the rand_b of 512 ids
# A version 4 UUID's variant digit: two of its four random bits kept, the top two set to 10.
_VARIANT_DIGIT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
_forks = 0  # forks this process came through: a child's copy of a block would repeat its parent's


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class RandomBlocks:
    """``os.urandom`` drawn ``RANDOM_BLOCK`` bytes at a time (one system call per id cost more).
    A process made by ``fork()`` (a pre-forking web server, a worker pool) draws a block of its
    own before its next bytes: the copy it inherited would repeat its parent's."""

    def __init__(self) -> None:
        self._block = b""
        self._at = 0
        self._forks = _forks

    def take(self, size: int) -> bytes:
        at = self._at
        if at + size > len(self._block) or self._forks != _forks:
            self._block = os.urandom(RANDOM_BLOCK)
            self._forks = _forks
            at = 0
        self._at = at + size
        return self._block[at : at + size]


class JobIds:
    """UUIDv7 job ids: time-ordered, so inserts append to the primary key and ids sort by creation.

    Ids made by one generator are strictly increasing: within a millisecond the 12-bit ``rand_a``
    field is a counter (RFC 9562, method 1), and a full counter borrows the next millisecond.
    """

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._last_ms = 0
        self._counter = 0
        self._random = RandomBlocks()

    def next(self) -> uuid.UUID:
        unix_ms = self._clock_ns() // 1_000_000
        if unix_ms <= self._last_ms:
            self._counter += 1
            if self._counter > 0xFFF:
                self._last_ms += 1
                self._counter = 0
            unix_ms = self._last_ms
        else:
            self._last_ms = unix_ms
            self._counter = 0
        value = (unix_ms & ((1 << 48) - 1)) << 80
        value |= 0x7 << 76  # version
        value |= self._counter << 64  # rand_a used as a counter
        value |= 0b10 << 62  # variant
        value |= int.from_bytes(self._random.take(8), "big") & ((1 << 62) - 1)  # rand_b
        return uuid.UUID(int=value)


class RandomIds:
    """Random (version 4) UUIDs as canonical text, for outcome events (thousands a second),
    written out directly from random bytes: 0.5 us an id against 2 us for ``str(uuid.uuid4())``,
    which makes a system call and a UUID object each."""

    def __init__(self) -> None:
        self._random = RandomBlocks()

    def next_text(self) -> str:
        h = self._random.take(16).hex()
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT_DIGIT[h[16]]}{h[17:20]}-{h[20:]}"


def id_hash(job_id_bytes: bytes) -> int:
    """The stable hash shards are chosen by (CRC-32: the same in every process and language)."""
    return zlib.crc32(job_id_bytes)


def shard_for(job_id_bytes: bytes, shards: Sequence[int]) -> int:
    """A stable choice among ``shards`` (the node's own, for jobs due soon; all, otherwise)."""
    return shards[id_hash(job_id_bytes) % len(shards)]
