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
_forks = 0  # forks this process came through: a child's copy of a pool would repeat its parent's


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class JobIds:
    """UUIDv7 job ids: time-ordered, so inserts append to the primary key and ids sort by creation.

    Ids made by one generator are strictly increasing: within a millisecond the 12-bit ``rand_a``
    field is a counter (RFC 9562, method 1), and a full counter borrows the next millisecond.
    """

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._last_ms = 0
        self._counter = 0
        self._random = b""  # os.urandom drawn in blocks: one system call per id cost more
        self._random_at = 0

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
        value |= self._rand_b()
        return uuid.UUID(int=value)

    def _rand_b(self) -> int:
        at = self._random_at
        if at >= len(self._random):
            self._random = os.urandom(RANDOM_BLOCK)
            at = 0
        self._random_at = at + 8
        return int.from_bytes(self._random[at : at + 8], "big") & ((1 << 62) - 1)


class RandomIds:
    """Random (version 4) UUIDs as canonical text, for outcome events (thousands a second): made
    from ``os.urandom`` drawn in blocks and written out directly, 0.4 us an id against 2 us for
    ``str(uuid.uuid4())``, which makes a system call and a UUID object each. A process made by
    ``fork()`` draws a fresh block before its first id."""

    def __init__(self) -> None:
        self._hex = ""  # RANDOM_BLOCK random bytes as hex digits, 32 an id
        self._at = 0
        self._forks = _forks

    def next_text(self) -> str:
        at = self._at
        if at >= len(self._hex) or self._forks != _forks:
            self._hex = os.urandom(RANDOM_BLOCK).hex()
            self._forks = _forks
            at = 0
        self._at = at + 32
        h = self._hex[at : at + 32]
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT_DIGIT[h[16]]}{h[17:20]}-{h[20:]}"


def id_hash(job_id_bytes: bytes) -> int:
    """The stable hash shards are chosen by (CRC-32: the same in every process and language)."""
    return zlib.crc32(job_id_bytes)


def shard_for(job_id_bytes: bytes, shards: Sequence[int]) -> int:
    """A stable choice among ``shards`` (the node's own, for jobs due soon; all, otherwise)."""
    return shards[id_hash(job_id_bytes) % len(shards)]
