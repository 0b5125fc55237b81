"""Ports for throwaway servers that no other process can be handed between choice and bind.

A port picked by binding 0 and closing is free only for a moment: another process may bind it
before the server it was meant for does (the kernel hands the same range to every caller, and
`rabbitmqctl` opens distribution ports of its own). So ports come from bands instead:

- The kernel chooses ephemeral ports (bind to 0, every outgoing connection) only inside
  ``ip_local_port_range`` (32768-60999 by default). A port below it is bound only by a process
  that names it, so bands lie below that range.
- A process takes a whole band by an exclusive ``flock`` on the band's file. The kernel drops
  the lock when the process dies, however it dies, so a band is never lost to a crash.
- A band hands each of its ports out once, in order, skipping any that something already
  listens on. No port is handed out twice, in one process or across them.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Final

FIRST_PORT: Final = 16000
BAND_SIZE: Final = 1000
BAND_COUNT: Final = 16  # 16000-31999: under the default ephemeral range
# Ports the project's own tools bind by name (RabbitMQ's default distribution port, `make
# cluster-ha`'s nodes): never handed out, whether or not they are bound right now.
FIXED: Final = frozenset({25672, 25681, 25682, 25683})
LOCKS: Final = Path(os.environ.get("DISPATCHER_PORT_LOCKS", tempfile.gettempdir())) / (
    "dispatcher-port-bands"
)
EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")


class PortsExhausted(RuntimeError):
    """Every band is held by another process, or lies inside the ephemeral range."""


def ephemeral_low() -> int:
    """The lowest port the kernel may choose by itself."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def is_bound(port: int) -> bool:
    """Whether any socket (any address, either family's wildcard) holds PORT already."""
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


class _Band:
    """One band this process holds: its lock file stays open (and locked) while it lives, as a
    bare descriptor (a file object would be reported unclosed at exit)."""

    def __init__(self, index: int, lock_fd: int) -> None:
        self.index = index
        self.lock_fd = lock_fd
        self.next = FIRST_PORT + index * BAND_SIZE
        self.end = self.next + BAND_SIZE

    def take(self, count: int) -> range | None:
        """COUNT consecutive ports none of which is bound or fixed, or None if the rest of
        the band has no such run."""
        start = self.next
        while start + count <= self.end:
            clash = next(
                (p for p in range(start, start + count) if p in FIXED or is_bound(p)), None
            )
            if clash is None:
                self.next = start + count
                return range(start, start + count)
            start = clash + 1
        self.next = self.end
        return None


class _Allocator:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._bands: list[_Band] = []
        self._pid = os.getpid()

    def take(self, count: int) -> range:
        with self._guard:
            if self._pid != os.getpid():
                # A forked child holds no lock of its own: the parent's bands are the parent's.
                self._bands, self._pid = [], os.getpid()
            if self._bands and (ports := self._bands[-1].take(count)) is not None:
                return ports
            while True:
                band = self._claim_band()
                self._bands.append(band)
                if (ports := band.take(count)) is not None:
                    return ports

    def _claim_band(self) -> _Band:
        LOCKS.mkdir(parents=True, exist_ok=True)
        held = {band.index for band in self._bands}
        limit = ephemeral_low()
        for index in range(BAND_COUNT):
            if index in held or FIRST_PORT + (index + 1) * BAND_SIZE > limit:
                continue
            fd = os.open(LOCKS / f"band-{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return _Band(index, fd)
        raise PortsExhausted(
            f"no free band of {BAND_SIZE} ports from {FIRST_PORT} below the ephemeral range "
            f"(from {limit}); held by this process: {sorted(held)}"
        )

    def bands(self) -> list[int]:
        with self._guard:
            return [band.index for band in self._bands] if self._pid == os.getpid() else []


_allocator = _Allocator()


def reserve_port() -> int:
    """A port no other process is handed and nothing listens on: bind it at leisure."""
    return _allocator.take(1).start


def reserve_ports(count: int) -> range:
    """COUNT consecutive such ports (a range a program picks from, such as `rabbitmqctl`'s)."""
    return _allocator.take(count)


def held_bands() -> list[int]:
    """The bands this process holds (a test looks)."""
    return _allocator.bands()


def wait_port_free(port: int, deadline_s: float = 15.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.1)
