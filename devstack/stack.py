"""`make run`'s services: PostgreSQL, RabbitMQ (with its management UI) and, for a cluster,
ZooKeeper as local processes under a root folder (.run/), on their standard ports unless told
otherwise, detached so they outlive the command that started them (``python -m devstack``).

Their Debian packages: devstack/packages.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from devstack import packages, tenants
from devstack.base import alive, recorded_pid
from devstack.ports import wait_port_free
from devstack.postgres import QUEUE_SETTINGS, PostgresServer
from devstack.rabbitmq import RabbitServer
from devstack.zookeeper import ZooKeeperServer

PORTS_FILE = "ports.json"  # under the root: what `down` stops, whichever ports `up` was given


@dataclass(frozen=True, slots=True, kw_only=True)
class Ports:
    """The services' ports; the defaults are the standard ones the default Settings point at."""

    postgres: int = 5432
    amqp: int = 5672
    management: int = 15672
    distribution: int = 25672
    zookeeper: int = 2181

    def save(self, root: Path) -> None:
        (root / PORTS_FILE).write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def load(cls, root: Path) -> Ports:
        path = root / PORTS_FILE
        return cls(**json.loads(path.read_text())) if path.exists() else cls()


@dataclass(frozen=True, slots=True, kw_only=True)
class Urls:
    """Where the services answer, as the dispatcher's settings name them."""

    database_url: str
    amqp_url: str
    management_url: str
    zk_hosts: str  # empty when ZooKeeper was not asked for


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def postgres_root(root: Path) -> Path:
    """Under ROOT, unless the postgres user cannot reach it (a checkout in /root, say)."""
    wanted = root / "postgres"
    if os.geteuid() != 0:
        return wanted
    probe = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(root)])
    if probe.returncode == 0:
        return wanted
    elsewhere = Path("/var/tmp") / f"dispatcher-{zlib.crc32(str(root).encode()):08x}" / "postgres"
    elsewhere.parent.mkdir(parents=True, exist_ok=True)
    elsewhere.parent.chmod(0o755)
    return elsewhere


def servers(root: Path, ports: Ports) -> tuple[PostgresServer, RabbitServer, ZooKeeperServer]:
    # The node name carries the AMQP port: two stacks on one machine must not share it in epmd.
    nodename = f"dispatcher-{ports.amqp}@localhost"
    return (
        PostgresServer(postgres_root(root), ports.postgres, settings=QUEUE_SETTINGS),
        RabbitServer(root / "rabbitmq", ports.amqp, ports.management, ports.distribution, nodename),
        ZooKeeperServer(root / "zookeeper", ports.zookeeper),
    )


def up(root: Path, ports: Ports, *, zookeeper: bool) -> Urls:
    """Start PostgreSQL and RabbitMQ (and ZooKeeper if asked) unless they already run."""
    packages.ensure({packages.Group.SERVICES})
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    ports.save(root)
    postgres, rabbit, zk = servers(root, ports)
    if postgres.is_running():
        print("postgres: already running")
    else:
        postgres.start()
    if "dispatcher" not in postgres.sql("SELECT datname FROM pg_database").split():
        postgres.create_database("dispatcher")
    wanted: list[tuple[str, RabbitServer | ZooKeeperServer, int]] = [
        ("rabbitmq", rabbit, ports.amqp)
    ]
    if zookeeper:
        wanted.append(("zookeeper", zk, ports.zookeeper))
    for name, server, port in wanted:
        if port_open(port):
            print(f"{name}: port {port} already answers; leaving it as it is")
        else:
            server.start()
    return Urls(
        database_url=postgres.dsn("dispatcher"),
        amqp_url=rabbit.url(),
        management_url=rabbit.mgmt_url,
        zk_hosts=zk.hosts if zookeeper else "",
    )


def describe(urls: Urls) -> str:
    lines = [
        "services are up:",
        f"  PostgreSQL  {urls.database_url}",
        f"  RabbitMQ    {urls.amqp_url}",
        f"  RabbitMQ UI {urls.management_url}  (guest / guest)",
        "  tenants     "
        + ", ".join(f"{tenants.user(t)} ({t}.*)" for t in tenants.TENANTS)
        + ": consumer users, password = user name, isolated from each other (topic permissions,"
        " DISPATCHER_EVENT_USERS); guest reports on every job",
    ]
    if urls.zk_hosts:
        lines.append(f"  ZooKeeper   {urls.zk_hosts}")
    return "\n".join(lines)


def terminate(pid_file: Path, port: int) -> None:
    """SIGTERM the process PID_FILE names if PORT still answers; wait until it has exited.

    A server closes its listener early in its shutdown and exits seconds later (a RabbitMQ node
    stops its queues after its AMQP port): a free port is not a stopped server. A server whose
    port is closed is not running, and its pid file may name a pid reused since: left alone."""
    if not port_open(port):
        return
    pid = recorded_pid(pid_file)
    if pid is not None:
        send(pid, signal.SIGTERM)
    stopped(pid, port)


def stopped(pid: int | None, port: int) -> None:
    wait_port_free(port, deadline_s=60)
    if pid is not None:
        wait_exited(pid, deadline_s=60)


def wait_exited(pid: int, *, deadline_s: float) -> None:
    """Wait for PID to exit; SIGKILL it when it outlives DEADLINE_S."""
    deadline = time.monotonic() + deadline_s
    while alive(pid):
        if time.monotonic() > deadline:
            send(pid, signal.SIGKILL)
            deadline = time.monotonic() + deadline_s
        time.sleep(0.1)


def stop_rabbitmq(server: RabbitServer, port: int) -> None:
    """``rabbitmqctl stop PIDFILE`` returns once the Erlang VM has exited, not when its AMQP
    listener closes; a node rabbitmqctl cannot reach by name (one an older .run/ started) gets
    SIGTERM. A node counts as running while its pid file names a live Erlang VM, port or not: a
    cluster's last node, paused as a minority once the others stopped, has closed its listeners."""
    pid_file = server.root / "rabbitmq.pid"
    pid = recorded_pid(pid_file)
    if pid is not None and not runs(pid, "beam"):
        pid = None
    if pid is None and not port_open(port):
        return
    server.ctl("stop", str(pid_file), check=False)
    if pid is not None and alive(pid):
        send(pid, signal.SIGTERM)
    stopped(pid, port)


def send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has exited meanwhile
        os.kill(pid, signum)


def runs(pid: int, program: str) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return program in Path(argv0.decode(errors="replace")).name and alive(pid)


def down(root: Path) -> None:
    """Stop the services `up` started under ROOT, on the ports it recorded."""
    ports = Ports.load(root)
    postgres, rabbit, _ = servers(root, ports)
    if postgres.is_running():
        postgres.stop()
    stop_rabbitmq(rabbit, ports.amqp)
    wait_port_free(ports.management, deadline_s=60)
    terminate(root / "zookeeper" / "zookeeper.pid", ports.zookeeper)
    print("services stopped")


def status(root: Path) -> None:
    ports = Ports.load(root)
    for name, port in (
        ("postgres", ports.postgres),
        ("rabbitmq", ports.amqp),
        ("zookeeper", ports.zookeeper),
    ):
        print(f"{name:10} {'up' if port_open(port) else 'down'} (port {port})")
