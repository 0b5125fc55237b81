"""Free TCP ports on the loopback interface.

Ports come from below the kernel's ephemeral range (32768-60999 by default): a port the kernel
hands out as free there can be taken a moment later by any process's outgoing connection, before
the server it was meant for binds it (a RabbitMQ node then fails with ``dist_port_already_used``).
Each pytest-xdist worker walks a band of its own, from an offset of its own, so two workers, or a
worker and a process it starts, do not hand out the same port.
"""

import os
import random
import re
import socket
import time

LOWEST = 10_000
BANDS = 4  # the serial process and up to three pytest-xdist workers
BAND = 5_000  # LOWEST + BANDS * BAND stays below the ephemeral range


def _band() -> int:
    worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return (int(worker.group(1)) + 1) % BANDS if worker else 0


_start = LOWEST + _band() * BAND
_cursor = random.Random(os.getpid()).randrange(BAND)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))  # taken on any address, 127.0.0.1 included
        except OSError:
            return False
        return True


def free_port() -> int:
    """The next port of this process's band that nothing listens on or holds."""
    global _cursor
    for _ in range(BAND):
        _cursor = (_cursor + 1) % BAND
        if _bindable(port := _start + _cursor):
            return port
    raise RuntimeError(f"no free port in {_start}-{_start + BAND - 1}")


def wait_port_free(port: int, deadline_s: float = 15.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.1)
