"""`make run`'s services: PostgreSQL, RabbitMQ (with its management UI) and ZooKeeper as local
processes under .run/, on their standard ports, detached so they outlive this command.

    python -m devstack.stack ensure|up|down|status [--root .run] [--browser]

``ensure`` only installs the Debian packages that are missing (``make test`` runs it with
``--browser``: the console's test drives Debian's chromium).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import zlib
from pathlib import Path

from devstack.ports import wait_port_free
from devstack.postgres import BIN as PG_BIN
from devstack.postgres import PostgresServer
from devstack.rabbitmq import BIN as RABBIT_BIN
from devstack.rabbitmq import RabbitServer
from devstack.zookeeper import ZooKeeperServer

PG_PORT, AMQP_PORT, MGMT_PORT, DIST_PORT, ZK_PORT = 5432, 5672, 15672, 25672, 2181
PACKAGES = ["postgresql", "rabbitmq-server", "zookeeper", "default-jre-headless"]
BROWSER_PACKAGES = ["chromium", "chromium-driver"]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ensure_packages(*, browser: bool = False) -> None:
    """Install the Debian packages that are missing, and stop the services they auto-start."""
    missing = not (PG_BIN / "initdb").exists() or not (RABBIT_BIN / "rabbitmq-server").exists()
    missing = (
        missing or not Path("/usr/share/java/zookeeper.jar").exists() or not shutil.which("java")
    )
    packages = PACKAGES if missing else []
    if browser and not (shutil.which("chromium") and shutil.which("chromedriver")):
        packages = [*packages, *BROWSER_PACKAGES]
    if not packages:
        return
    if os.geteuid() != 0:
        sys.exit(f"missing {' '.join(packages)}: run as root to install them")
    print("installing", " ".join(packages))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)
    stop_system_services()


def stop_system_services() -> None:
    """Debian may start its own PostgreSQL and RabbitMQ on install; ours need their ports."""
    for command in (
        ["service", "rabbitmq-server", "stop"],
        ["service", "postgresql", "stop"],
        ["service", "zookeeper", "stop"],
    ):
        if shutil.which(command[0]):
            subprocess.run(command, capture_output=True)


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


def servers(root: Path) -> tuple[PostgresServer, RabbitServer, ZooKeeperServer]:
    return (
        PostgresServer(postgres_root(root), PG_PORT),
        RabbitServer(root / "rabbitmq", AMQP_PORT, MGMT_PORT, DIST_PORT, "dispatcher@localhost"),
        ZooKeeperServer(root / "zookeeper", ZK_PORT),
    )


def up(root: Path) -> None:
    ensure_packages()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    postgres, rabbit, zookeeper = servers(root)
    if postgres.is_running():
        print("postgres: already running")
    else:
        postgres.start()
    if "dispatcher" not in postgres.sql("SELECT datname FROM pg_database").split():
        postgres.create_database("dispatcher")
    for name, server, port in (("rabbitmq", rabbit, AMQP_PORT), ("zookeeper", zookeeper, ZK_PORT)):
        if port_open(port):
            print(f"{name}: port {port} already answers; leaving it as it is")
        else:
            server.start()
    print(
        "\nservices are up:\n"
        f"  PostgreSQL  {postgres.dsn('dispatcher')}\n"
        f"  RabbitMQ    {rabbit.url()}\n"
        f"  RabbitMQ UI {rabbit.mgmt_url}  (guest / guest)\n"
        f"  ZooKeeper   {zookeeper.hosts}\n"
    )


def down(root: Path) -> None:
    postgres, rabbit, _ = servers(root)
    if postgres.is_running():
        postgres.stop()
    if port_open(AMQP_PORT):
        rabbit.ctl("stop", check=False)
    if port_open(ZK_PORT):
        pid_file = root / "zookeeper" / "zookeeper.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            wait_port_free(ZK_PORT)
    print("services stopped")


def status(root: Path) -> None:
    for name, port in (("postgres", PG_PORT), ("rabbitmq", AMQP_PORT), ("zookeeper", ZK_PORT)):
        print(f"{name:10} {'up' if port_open(port) else 'down'} (port {port})")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.stack")
    parser.add_argument("command", choices=["ensure", "up", "down", "status"])
    parser.add_argument("--root", type=Path, default=Path(".run"))
    parser.add_argument("--browser", action="store_true", help="ensure: chromium too (tests)")
    args = parser.parse_args()
    commands = {
        "ensure": lambda _: ensure_packages(browser=args.browser),
        "up": up,
        "down": down,
        "status": status,
    }
    commands[args.command](args.root.resolve())


if __name__ == "__main__":
    main()
