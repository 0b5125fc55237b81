"""`make cluster-ha`: the production topology on one machine, every tier replicated.

Three RabbitMQ nodes clustered, a PostgreSQL primary with a synchronous streaming standby and a
three-server ZooKeeper ensemble, all under ROOT/ha/ on ports of their own (beside `make run`'s
services on the standard ones), for three dispatcher nodes that name every server of each tier.

It is a topology to watch failovers in, so it starts fresh: ``down`` stops it and deletes its
data (a killed primary, a promoted standby or a node left out of the cluster do not carry over
into the next ``up``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from devstack import packages, stack
from devstack.postgres import PostgresServer
from devstack.postgres_standby import PrimaryWithStandby
from devstack.rabbitmq import RabbitServer
from devstack.rabbitmq_cluster import RabbitCluster
from devstack.zookeeper_ensemble import SIZE, Peer, ZooKeeperEnsemble

HA = "ha"  # under ROOT
PORTS_FILE = "ports.json"  # under ROOT/HA: what `down` stops, whichever ports `up` was given
DATABASE = "dispatcher"
# The three client ports, then the three quorum ports, then the three election ports.
ENSEMBLE_PORTS = "2191,2192,2193,2891,2892,2893,3891,3892,3893"
# The three AMQP ports, then the three management ports, then the three distribution ports.
RABBITMQ_PORTS = "5681,5682,5683,15681,15682,15683,25681,25682,25683"
POSTGRES_PORTS = "5441,5442"  # the primary, then the standby


def _ports(text: str, count: int, what: str) -> list[int]:
    ports = [int(port) for port in text.split(",")]
    if len(ports) != count:
        raise ValueError(f"{count} ports: {what}")
    return ports


@dataclass(frozen=True, slots=True)
class Broker:
    amqp: int
    management: int
    distribution: int


@dataclass(frozen=True, slots=True)
class Topology:
    """Every port of the replicated services."""

    zookeeper: list[Peer]
    rabbitmq: list[Broker]
    postgres: list[int]  # the primary, then the standby

    @classmethod
    def parse(cls, ensemble: str, rabbitmq: str, postgres: str) -> Topology:
        zk = _ports(ensemble, 3 * SIZE, "client ports, then quorum, then election ports")
        mq = _ports(rabbitmq, 3 * SIZE, "AMQP ports, then management, then distribution ports")
        return cls(
            [Peer(n + 1, zk[n], zk[SIZE + n], zk[2 * SIZE + n]) for n in range(SIZE)],
            [Broker(mq[n], mq[SIZE + n], mq[2 * SIZE + n]) for n in range(SIZE)],
            _ports(postgres, 2, "the primary's, then the standby's"),
        )

    def save(self, root: Path) -> None:
        (root / HA / PORTS_FILE).write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def saved(cls, root: Path) -> Topology | None:
        """The topology ``up`` started under ROOT, if it did."""
        path = root / HA / PORTS_FILE
        if not path.exists():
            return None
        fields = json.loads(path.read_text())
        return cls(
            [Peer(**peer) for peer in fields["zookeeper"]],
            [Broker(**broker) for broker in fields["rabbitmq"]],
            list(fields["postgres"]),
        )

    def ensemble(self, root: Path) -> ZooKeeperEnsemble:
        return ZooKeeperEnsemble(root / HA / "zookeeper", self.zookeeper)

    def brokers(self, root: Path) -> RabbitCluster:
        # Node names carry the AMQP port, as `make run`'s does: unique in epmd on this machine.
        return RabbitCluster(
            [
                RabbitServer(
                    root / HA / f"rabbitmq{number}",
                    broker.amqp,
                    broker.management,
                    broker.distribution,
                    f"dispatcher-ha-{broker.amqp}@localhost",
                )
                for number, broker in enumerate(self.rabbitmq, start=1)
            ]
        )

    def databases(self, root: Path) -> PrimaryWithStandby:
        base = postgres_base(root)
        primary, standby = self.postgres
        return PrimaryWithStandby(
            PostgresServer(base / "primary", primary), PostgresServer(base / "standby", standby)
        )


def postgres_base(root: Path) -> Path:
    """Where the pair's data lives: beside `make run`'s PostgreSQL, wherever that has to be."""
    return stack.postgres_root(root).parent / f"{HA}-postgres"


def up(root: Path, topology: Topology) -> stack.Urls:
    """Start every tier from nothing (what a previous ``up`` left is stopped and deleted first);
    the URLs a node is given name every server."""
    packages.ensure({packages.Group.SERVICES})
    down(root)
    (root / HA).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    topology.save(root)
    databases = topology.databases(root)
    brokers = topology.brokers(root)
    ensemble = topology.ensemble(root)
    starts: list[Callable[[], None]] = [
        lambda: databases.start(DATABASE),
        brokers.start,
        ensemble.start,
    ]
    # The tiers start side by side: three RabbitMQ nodes alone take a minute on two cores.
    with concurrent.futures.ThreadPoolExecutor(len(starts)) as pool:
        for started in [pool.submit(start) for start in starts]:
            started.result()
    return stack.Urls(
        database_url=databases.dsn(DATABASE),
        amqp_url=brokers.url(),
        management_url=brokers.seed.mgmt_url,
        zk_hosts=ensemble.hosts,
    )


def down(root: Path) -> None:
    """Stop every server ``up`` started under ROOT and delete the topology's data."""
    if (topology := Topology.saved(root)) is None:
        return
    for member in topology.ensemble(root).members:
        stack.terminate(member.root / "zookeeper.pid", member.client_port)
    for broker in reversed(topology.brokers(root).nodes):
        stack.stop_rabbitmq(broker, broker.amqp_port)
    topology.databases(root).stop()
    shutil.rmtree(postgres_base(root), ignore_errors=True)
    shutil.rmtree(root / HA, ignore_errors=True)
    print("replicated services stopped")


def status(root: Path) -> None:
    if (topology := Topology.saved(root)) is None:
        return
    named = [(f"zookeeper{peer.server_id}", peer.client_port) for peer in topology.zookeeper]
    named += [(f"rabbitmq{n}", broker.amqp) for n, broker in enumerate(topology.rabbitmq, 1)]
    named += list(zip(("postgres-primary", "postgres-standby"), topology.postgres, strict=True))
    for name, port in named:
        print(f"{name:17} {'up' if stack.port_open(port) else 'down'} (port {port})")
