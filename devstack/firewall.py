"""Cut one process from one service: a firewall rule on that process's own packets.

The process runs under a group of its own (``Firewall.gid``, handed to ``DispatcherProcess``); a
rule in iptables' OUTPUT chain drops the TCP packets that group sends to a port. Loopback
traffic passes OUTPUT too, so a node is cut from a service on this machine as it would be by a
network: its packets go nowhere (no reset, no error), the service's own packets still arrive.
Every other process, and the other nodes, keep every path.
"""

from __future__ import annotations

import grp
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit


def port_of(url: str) -> int:
    """The port of a service's URL or host list (its first host): what a rule cuts."""
    first = url.split(",")[0]
    if "://" not in first:
        first = f"tcp://{first.split('/')[0]}"
    port = urlsplit(first).port
    assert port is not None
    return port


def available() -> bool:
    return shutil.which("iptables") is not None and shutil.which("groupadd") is not None


class Firewall:
    def __init__(self) -> None:
        self.group = f"dsp-{uuid.uuid4().hex[:10]}"
        subprocess.run(["groupadd", self.group], check=True, capture_output=True)
        self.gid = grp.getgrnam(self.group).gr_gid
        self._cut: set[int] = set()

    def _rule(self, port: int) -> list[str]:
        return [
            "OUTPUT",
            "-p",
            "tcp",
            "--dport",
            str(port),
            "-m",
            "owner",
            "--gid-owner",
            str(self.gid),
            "-j",
            "DROP",
        ]

    def cut(self, port: int) -> None:
        """Drop every packet the group sends to PORT from now on."""
        subprocess.run(["iptables", "-I", *self._rule(port)], check=True, capture_output=True)
        self._cut.add(port)

    def heal(self, port: int) -> None:
        if port in self._cut:
            subprocess.run(["iptables", "-D", *self._rule(port)], check=True, capture_output=True)
            self._cut.discard(port)

    def close(self) -> None:
        for port in list(self._cut):
            self.heal(port)
        subprocess.run(["groupdel", self.group], check=False, capture_output=True)


@contextmanager
def firewall() -> Iterator[Firewall]:
    wall = Firewall()
    try:
        yield wall
    finally:
        wall.close()
