"""A RabbitMQ cluster of three nodes on one machine, built from RabbitServer nodes.

Each node has its own name, data, AMQP, management and Erlang distribution ports; they share one
Erlang cookie (the same ``.erlang.cookie`` in each node's HOME). The nodes form the cluster as they
boot, through RabbitMQ's peer discovery (the ``classic_config`` backend, ``formation``): on 3.x
node 1 boots first and nodes 2 and 3 then join it; on 4.x all three boot at once, each naming all
three. Joining by hand (``stop_app``, ``reset``, ``join_cluster``, ``start_app`` for each node,
one CLI VM a step) took longer: 36 s against 19-21 s on 3.x, 24 s against 8-9 s on 4.x (the
machine idle). Three nodes because quorum queues need a majority: three tolerate the loss of one.

A killed node (``kill``, SIGKILL) keeps its data and its membership: ``restart`` starts it again
and waits until it runs in the cluster once more.
"""

from __future__ import annotations

import concurrent.futures
import json
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from devstack.base import ServiceError
from devstack.ports import reserve_port
from devstack.rabbitmq import RabbitServer

SIZE = 3
CLUSTERED_S = 120.0  # a node on a loaded two-core machine can take a minute to sync
POLL_S = 1.0
# What RabbitMQ's production guides recommend for a cluster: a minority side of a partition
# pauses instead of diverging (quorum queues stay consistent either way).
CLUSTER_CONFIG = "cluster_partition_handling = pause_minority\n"
# A node asks for its peers every half second for as long as a cluster may take to form: they
# boot beside it and may answer last. (Only a node with no data asks: a restarted member rejoins
# by the membership it kept.)
DISCOVERY_RETRY_S = 0.5


def formation(node: RabbitServer, seed: RabbitServer, members: Sequence[RabbitServer]) -> str:
    """The rabbitmq.conf lines by which NODE joins the cluster as it boots.

    3.x: nodes other than SEED name SEED and join it (once it has booted). 4.x picks the node to
    join among those it names and reaches, itself included, so a node naming only the seed formed
    a cluster of its own when the seed answered late (2 starts in 5): every member names all of
    them and waits until it sees them all, and all boot at once."""
    if node.major < 4 and node is seed:
        return ""
    named = [seed] if node.major < 4 else members
    lines = ["cluster_formation.peer_discovery_backend = classic_config"]
    lines += [
        f"cluster_formation.classic_config.nodes.{n} = {peer.nodename}"
        for n, peer in enumerate(named, 1)
    ]
    if node.major >= 4:
        lines.append(f"cluster_formation.target_cluster_size_hint = {len(members)}")
    lines.append(
        f"cluster_formation.discovery_retry_limit = {int(CLUSTERED_S / DISCOVERY_RETRY_S)}"
    )
    lines.append(f"cluster_formation.discovery_retry_interval = {int(DISCOVERY_RETRY_S * 1000)}")
    return "".join(f"{line}\n" for line in lines)


# How a node is made: root, AMQP port, management port, distribution port, node name.
NodeFactory = Callable[[Path, int, int, int, str], RabbitServer]


def system_node(
    root: Path, amqp_port: int, mgmt_port: int, dist_port: int, name: str
) -> RabbitServer:
    return RabbitServer(root, amqp_port, mgmt_port, dist_port, name)


class RabbitCluster:
    def __init__(self, nodes: Sequence[RabbitServer]) -> None:
        if len(nodes) < 2:
            raise ValueError("a cluster has at least two nodes")
        self.nodes = list(nodes)
        self._cookie = secrets.token_hex(16).upper()

    @classmethod
    def local(
        cls, root: Path, *, size: int = SIZE, make: NodeFactory = system_node
    ) -> RabbitCluster:
        """SIZE nodes under ROOT (one folder each) on free ports; node names unique to it."""
        prefix = f"cluster-{uuid.uuid4().hex[:8]}"
        return cls(
            [
                make(
                    root / f"node{number}",
                    reserve_port(),
                    reserve_port(),
                    reserve_port(),
                    f"{prefix}-{number}@localhost",
                )
                for number in range(1, size + 1)
            ]
        )

    @property
    def seed(self) -> RabbitServer:
        return self.nodes[0]

    def start(self) -> None:
        """Start every node and cluster them; returns once all of them run in the cluster."""
        for node in self.nodes:
            self._prepare(node)
        if self.seed.major < 4:
            # A 3.x node joining a seed that is still enabling its feature flags fails its schema
            # check (``table_attributes_mismatch``, 1 start in 4): the seed boots first.
            self.seed.start()
        # Side by side (a node boots in 10 s or more), and each node's own start: a 4.x node
        # mounts /proc in its chroot first (RabbitServer.start here left it unmounted).
        _each([node for node in self.nodes if not node.is_running()], lambda node: node.start())
        self.wait_clustered()

    def _prepare(self, node: RabbitServer) -> None:
        node.config_lines = CLUSTER_CONFIG + formation(node, self.seed, self.nodes)
        node.root.mkdir(parents=True, exist_ok=True)
        cookie = node.root / ".erlang.cookie"  # HOME is the node's root (RabbitServer.env)
        if not cookie.exists():
            cookie.write_text(self._cookie)
            cookie.chmod(0o400)  # Erlang refuses a cookie others can read

    def running_nodes(self, via: RabbitServer | None = None) -> set[str]:
        """The node names VIA (default: the first running node) sees running in the cluster."""
        return (via or self.any_running()).running_nodes()

    def wait_clustered(self, deadline_s: float = CLUSTERED_S) -> None:
        """Until every node runs and sees every node running."""
        names = {node.nodename for node in self.nodes}

        def clustered() -> bool:
            if not all(node.is_running() for node in self.nodes):
                return False
            try:
                return all(self.running_nodes(node) == names for node in self.nodes)
            except ServiceError:  # a node still booting does not answer yet
                return False

        end = time.monotonic() + deadline_s
        while not clustered():
            if time.monotonic() > end:
                raise ServiceError("rabbitmq cluster", "nodes did not all join", self.logs())
            time.sleep(POLL_S)

    def any_running(self) -> RabbitServer:
        for node in self.nodes:
            if node.is_running():
                return node
        raise ServiceError("rabbitmq cluster", "no node runs", self.logs())

    def node_named(self, name: str) -> RabbitServer:
        for node in self.nodes:
            if node.nodename == name:
                return node
        raise KeyError(name)

    def leader_of(self, queue: str, vhost: str = "/") -> RabbitServer:
        """The node that leads quorum queue QUEUE (as a running node sees it)."""
        listed = json.loads(
            self.any_running().ctl(
                "list_queues", "-p", vhost, "name", "leader", "--formatter", "json"
            )
            or "[]"
        )
        for entry in listed:
            if entry.get("name") == queue and entry.get("leader"):
                return self.node_named(str(entry["leader"]))
        raise KeyError(queue)

    def kill(self, node: RabbitServer) -> None:
        """A crash: SIGKILL to the node's processes; the others stay up."""
        node.kill()

    def restart(self, node: RabbitServer) -> None:
        """Start a stopped or killed node again; it rejoins with the membership it kept."""
        if not node.is_running():
            node.start()
        self.wait_clustered()

    def heal(self) -> None:
        """Every node running and clustered again (after a test killed some)."""
        for node in self.nodes:
            if not node.is_running():
                node.start()
        self.wait_clustered()

    def stop(self) -> None:
        _each(self.nodes, lambda node: node.stop())

    def urls(self, vhost: str = "/") -> list[str]:
        return [node.url(vhost) for node in self.nodes]

    def url(self, vhost: str = "/") -> str:
        """Every node's URL, comma-separated, as DISPATCHER_AMQP_URL takes them."""
        return ",".join(self.urls(vhost))

    def create_vhost(self, name: str) -> None:
        self.any_running().create_vhost(name)

    def logs(self) -> str:
        return "\n".join(f"--- {node.nodename} ---\n{node.logs()}" for node in self.nodes)


def _each(nodes: Sequence[RabbitServer], action: Callable[[RabbitServer], None]) -> None:
    """ACTION on every node at once; the first failure is raised once all are done."""
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        for done in [pool.submit(action, node) for node in nodes]:
            done.result()
