"""TCP options that make a dead connection fail within seconds rather than the system's minutes.

A connection whose packets stop arriving (a firewall change, a host gone, a half-open peer)
looks open: writes queue in the kernel and reads wait. ``keep_alive`` bounds that on a socket:
data unacknowledged for ``dead_s`` fails it (``TCP_USER_TIMEOUT``), and an idle one is probed
from half of ``dead_s`` on, once a second (keepalive), as libpq's ``tcp_user_timeout`` and
``keepalives_*`` do. Used on PostgreSQL's, RabbitMQ's and ZooKeeper's sockets alike.
"""

from __future__ import annotations

import socket
from typing import Protocol


class Socket(Protocol):
    @property
    def family(self) -> int: ...

    def setsockopt(self, level: int, option: int, value: int, /) -> None: ...


def keep_alive(sock: Socket | None, dead_s: float) -> None:
    """Set the options on SOCK (a TCP socket; anything else, such as a Unix socket, is left)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    idle = max(1, int(dead_s / 2))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, int(dead_s) - idle))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(dead_s * 1000))
