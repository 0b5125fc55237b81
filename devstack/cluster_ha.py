"""`make cluster-ha`: the production topology on one machine, one tier at a time.

Today: a three-server ZooKeeper ensemble (under ROOT/zookeeper-ensemble/, beside `make cluster`'s
standalone server on 2181) with PostgreSQL and RabbitMQ as `make run` starts them. The RabbitMQ
cluster and the PostgreSQL standby each replace their single server in ``up`` below and add
their processes to ``down`` and ``status``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from devstack import stack
from devstack.zookeeper_ensemble import SIZE, Peer, ZooKeeperEnsemble

ENSEMBLE = "zookeeper-ensemble"
PEERS_FILE = "peers.json"  # under ROOT/ENSEMBLE: what `down` stops, whichever ports `up` was given
# The three client ports, then the three quorum ports, then the three election ports.
ENSEMBLE_PORTS = "2191,2192,2193,2891,2892,2893,3891,3892,3893"


def parse_ports(text: str) -> list[Peer]:
    ports = [int(port) for port in text.split(",")]
    if len(ports) != 3 * SIZE:
        raise ValueError(f"{3 * SIZE} ports: client ports, then quorum, then election ports")
    return [Peer(n + 1, ports[n], ports[SIZE + n], ports[2 * SIZE + n]) for n in range(SIZE)]


def saved(root: Path) -> ZooKeeperEnsemble | None:
    """The ensemble ``up`` started under ROOT, if it did."""
    path = root / ENSEMBLE / PEERS_FILE
    if not path.exists():
        return None
    return ZooKeeperEnsemble(
        root / ENSEMBLE, [Peer(**peer) for peer in json.loads(path.read_text())]
    )


def up(root: Path, ports: stack.Ports, peers: list[Peer]) -> stack.Urls:
    """Every tier's services, unless already running; the URLs a node is given."""
    urls = stack.up(root, ports, zookeeper=False)
    servers = ZooKeeperEnsemble(root / ENSEMBLE, peers)
    (root / ENSEMBLE).mkdir(parents=True, exist_ok=True)
    (root / ENSEMBLE / PEERS_FILE).write_text(json.dumps([dataclasses.asdict(p) for p in peers]))
    # Detached: the servers outlive this command; `make down` stops them.
    missing = [m for m in servers.members if not stack.port_open(m.client_port)]
    for member in missing:
        member.launch()
    for member in missing:
        member.wait_ready(90)
    return dataclasses.replace(urls, zk_hosts=servers.hosts)


def down(root: Path) -> None:
    if (servers := saved(root)) is not None:
        for member in servers.members:
            stack.terminate(member.root / "zookeeper.pid", member.client_port)


def status(root: Path) -> None:
    if (servers := saved(root)) is not None:
        for member in servers.members:
            state = "up" if stack.port_open(member.client_port) else "down"
            print(f"{f'zookeeper{member.server_id}':10} {state} (port {member.client_port})")
