"""``python -m devstack ensure | up | cluster | cluster-ha | down | status``: what `make run`,
`make cluster`, `make cluster-ha`, `make down` and `make test` call.

    up       PostgreSQL + RabbitMQ (what the default single-node settings use), migrated, with
             the tenants' broker users (devstack/tenants.py)
    serve    up, then become one node in the foreground on --http-port (`make run`)
    cluster  ZooKeeper too, then NODES dispatcher nodes in the background on --http-ports
    cluster-ha  as cluster, on replicated services: three RabbitMQ nodes, a PostgreSQL primary
             with a synchronous standby, three ZooKeeper servers (devstack/cluster_ha.py)
    down     every node and service started under --root, whichever ports they were given
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devstack import cluster_ha, nodes, packages, stack, tenants

CLUSTER_HTTP_PORTS = "8081,8082,8083"  # beside `make run`'s 8080


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    parser.add_argument(
        "command", choices=["ensure", "up", "serve", "cluster", "cluster-ha", "down", "status"]
    )
    parser.add_argument("--root", type=Path, default=Path(".run"), help="data, logs and pids")
    parser.add_argument("--browser", action="store_true", help="ensure: chromium too (tests)")
    parser.add_argument(
        "--faults", action="store_true", help="ensure: libfaketime and iptables too (tests)"
    )
    parser.add_argument(
        "--chroot", action="store_true", help="ensure: debootstrap too (the RabbitMQ 4.x tests)"
    )
    defaults = stack.Ports()
    for field in ("postgres", "amqp", "management", "distribution", "zookeeper"):
        parser.add_argument(f"--{field}-port", type=int, default=getattr(defaults, field))
    parser.add_argument(
        "--ensemble-ports",
        default=cluster_ha.ENSEMBLE_PORTS,
        help="cluster-ha: ZooKeeper's three client, then quorum, then election ports",
    )
    parser.add_argument(
        "--rabbitmq-ha-ports",
        default=cluster_ha.RABBITMQ_PORTS,
        help="cluster-ha: RabbitMQ's three AMQP, then management, then distribution ports",
    )
    parser.add_argument(
        "--postgres-ha-ports",
        default=cluster_ha.POSTGRES_PORTS,
        help="cluster-ha: the PostgreSQL primary's port, then its standby's",
    )
    parser.add_argument("--http-port", type=int, default=8080, help="serve: the node's HTTP port")
    parser.add_argument(
        "--http-ports",
        default=CLUSTER_HTTP_PORTS,
        help="cluster: one node per comma-separated HTTP port",
    )
    return parser.parse_args(argv)


def up(
    root: Path, ports: stack.Ports, *, zookeeper: bool, ha: cluster_ha.Topology | None = None
) -> stack.Urls:
    """``ha``: the replicated services of ``cluster-ha`` instead of one server per tier."""
    urls = stack.up(root, ports, zookeeper=zookeeper) if ha is None else cluster_ha.up(root, ha)
    tenants.apply(urls.management_url)
    nodes.migrate(urls)
    print(f"\n{stack.describe(urls)}\n  data, logs  {root}\n")
    return urls


def refuse_if_running(root: Path) -> None:
    """A single node and a cluster on one database would both fire every shard."""
    if running := nodes.running(root):
        sys.exit(f"{' '.join(running)} already run under {root}: 'make down' first")


def serve(root: Path, ports: stack.Ports, http_port: int) -> None:
    refuse_if_running(root)
    urls = up(root, ports, zookeeper=False)
    url = f"http://127.0.0.1:{http_port}"
    print(f"API docs:    {url}/docs\nConsole:     {url}/console/")
    print("Ctrl-C stops the dispatcher; 'make down' stops it and the services.")
    nodes.serve(root, urls, "dispatcher", http_port)


def cluster(
    root: Path, ports: stack.Ports, http_ports: list[int], *, ha: cluster_ha.Topology | None = None
) -> None:
    refuse_if_running(root)
    urls = up(root, ports, zookeeper=True, ha=ha)
    started = [
        nodes.start(root, urls, f"node-{number}", port)
        for number, port in enumerate(http_ports, start=1)
    ]
    for node in started:
        nodes.wait_ready(node)
    print("nodes are ready:")
    for node in started:
        print(f"  {node.name}  {node.url}  (console {node.url}/console/, log {node.log})")
    print(f"  cluster view: {started[0].url}/v1/cluster\n'make down' stops the nodes and services.")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root: Path = args.root.resolve()
    ports = stack.Ports(
        postgres=args.postgres_port,
        amqp=args.amqp_port,
        management=args.management_port,
        distribution=args.distribution_port,
        zookeeper=args.zookeeper_port,
    )
    if args.command == "ensure":
        groups = {packages.Group.SERVICES}
        groups |= {packages.Group.BROWSER} if args.browser else set()
        groups |= {packages.Group.FAULTS} if args.faults else set()
        packages.ensure(groups | ({packages.Group.CHROOT} if args.chroot else set()))
    elif args.command == "up":
        up(root, ports, zookeeper=False)
    elif args.command == "serve":
        serve(root, ports, args.http_port)
    elif args.command in {"cluster", "cluster-ha"}:
        http_ports = [int(port) for port in args.http_ports.split(",")]
        topology = None
        if args.command == "cluster-ha":
            topology = cluster_ha.Topology.parse(
                args.ensemble_ports, args.rabbitmq_ha_ports, args.postgres_ha_ports
            )
        cluster(root, ports, http_ports, ha=topology)
    elif args.command == "down":
        for name in nodes.stop_all(root):
            print(f"{name}: stopped")
        cluster_ha.down(root)
        stack.down(root)
    else:
        print("nodes:", " ".join(nodes.running(root)) or "none")
        stack.status(root)
        cluster_ha.status(root)


if __name__ == "__main__":
    main()
