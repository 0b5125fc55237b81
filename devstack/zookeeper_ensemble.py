"""A three-server ZooKeeper ensemble on one machine, from the same jars as the standalone server.

Each member has its own dataDir with its ``myid``, its own client port, and a quorum and an
election port of its own; every member lists all of them (``server.N=host:quorum:election``).
Who leads is asked with the ``srvr`` four-letter word (``Mode: leader``); which member serves a
client session, with ``cons`` (its ``sid=0x...``): so they work on servers another process
started (``make cluster-ha``); a server that is down answers neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from devstack.base import ServiceError, wait_until
from devstack.ports import reserve_port
from devstack.zookeeper import ZooKeeperServer

SIZE = 3
# In ticks of 500 ms: a follower has 10 s to connect and sync to a new leader, and may lag 5 s
# before the leader drops it. Generous for a loaded machine; short enough for a quick election.
INIT_LIMIT = 20
SYNC_LIMIT = 10


@dataclass(frozen=True, slots=True)
class Peer:
    server_id: int
    client_port: int
    quorum_port: int
    election_port: int

    def line(self) -> str:
        return f"server.{self.server_id}=127.0.0.1:{self.quorum_port}:{self.election_port}"


class EnsembleMember(ZooKeeperServer):
    """One server of an ensemble: ready once it has joined a quorum (leader or follower)."""

    def __init__(self, root: Path, peer: Peer, peers: list[Peer]) -> None:
        super().__init__(root, peer.client_port)
        self.server_id = peer.server_id
        self._peers = peers

    def config(self) -> list[str]:
        return [
            *super().config(),
            f"initLimit={INIT_LIMIT}",
            f"syncLimit={SYNC_LIMIT}",
            *(peer.line() for peer in self._peers),
        ]

    def launch(self) -> None:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "data" / "myid").write_text(f"{self.server_id}\n")
        super().launch()

    def _ready(self) -> bool:
        return super()._ready() and self.mode() in {"leader", "follower"}

    def mode(self) -> str:
        """``leader``, ``follower``, or ``""`` (down, or looking for a quorum)."""
        found = re.search(r"^Mode: (\w+)", self.four_letter("srvr"), re.MULTILINE)
        return found.group(1) if found else ""

    def serves(self, session_id: int) -> bool:
        """Whether a client of this session is connected to this server right now."""
        return f"sid={session_id:#x}," in self.four_letter("cons")


def free_peers(size: int = SIZE) -> list[Peer]:
    return [Peer(n, reserve_port(), reserve_port(), reserve_port()) for n in range(1, size + 1)]


class ZooKeeperEnsemble:
    def __init__(self, root: Path, peers: list[Peer] | None = None) -> None:
        """``peers``: the servers' ports; free ones (tests) unless given (``make cluster-ha``)."""
        peers = peers or free_peers()
        self.members = [EnsembleMember(root / f"zk{peer.server_id}", peer, peers) for peer in peers]
        self.hosts = ",".join(member.hosts for member in self.members)

    def start(self, deadline_s: float = 90) -> None:
        """Launch every member, then wait until each has joined the quorum."""
        try:
            for member in self.members:
                member.launch()
            for member in self.members:
                member.wait_ready(deadline_s)
        except BaseException:
            self.stop()  # no server left behind
            raise

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def leader(self, deadline_s: float = 60) -> EnsembleMember:
        """The member that leads, once one does (after a leader's loss, the next elected)."""
        found: list[EnsembleMember] = []

        def elected() -> bool:
            found[:] = [m for m in self.members if m.mode() == "leader"]
            return len(found) == 1

        if not wait_until(elected, deadline_s):
            raise ServiceError("zookeeper", f"no leader after {deadline_s:.0f}s", self.logs())
        return found[0]

    def followers(self) -> list[EnsembleMember]:
        return [m for m in self.members if m.mode() == "follower"]

    def serving(self, session_id: int) -> EnsembleMember | None:
        """The member a client session is connected to, if any."""
        return next((m for m in self.members if m.serves(session_id)), None)

    def logs(self) -> str:
        return "\n".join(f"--- zk{m.server_id}\n{m.logs()}" for m in self.members)
