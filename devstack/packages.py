"""The Debian packages the local services, the browser tests, the RabbitMQ 4.x chroot and the
benchmarks need: one list, with the file by which each is known to be installed. `make run`,
`make test` and `bench/` install from it and nothing else does (a test holds this, and checks each
file against dpkg).

Standard library only: the Makefile runs ``python3 -m devstack.packages python`` before any
virtual environment exists (Debian's python3 makes none without python3-venv)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from devstack.postgres import BIN as PG_BIN

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # devstack.rabbitmq.BIN's (a test)


class Group(Enum):
    PYTHON = "python"  # a virtual environment from Debian's python3: make venv, make run
    SERVICES = "services"  # PostgreSQL, RabbitMQ, ZooKeeper: make run, make cluster, the tests
    BROWSER = "browser"  # the console's and the management UI's browser tests
    CHROOT = "chroot"  # the Debian trixie chroot the RabbitMQ 4.x tests run in
    BENCH = "bench"  # bench/: a native HTTP load generator
    # The fault tests' tools: libfaketime, a node's wrong wall clock; iptables, a node cut from
    # one service by a rule on its own packets.
    FAULTS = "faults"


@dataclass(frozen=True, slots=True)
class Package:
    name: str
    group: Group
    marker: Path  # a file the package itself installs (dpkg -S names it)

    def installed(self) -> bool:
        return self.marker.exists()


PACKAGES = (
    Package("postgresql-15", Group.SERVICES, PG_BIN / "initdb"),
    Package("python3-venv", Group.PYTHON, Path("/usr/share/doc/python3-venv")),
    Package("rabbitmq-server", Group.SERVICES, RABBITMQ_SERVER),
    Package("zookeeper", Group.SERVICES, Path("/etc/zookeeper/conf_example/zoo.cfg")),
    Package("libzookeeper-java", Group.SERVICES, Path("/usr/share/java/zookeeper.jar")),
    Package("default-jre-headless", Group.SERVICES, Path("/usr/lib/jvm/default-java")),
    Package("chromium", Group.BROWSER, Path("/usr/bin/chromium")),
    Package("chromium-driver", Group.BROWSER, Path("/usr/bin/chromedriver")),
    Package("debootstrap", Group.CHROOT, Path("/usr/sbin/debootstrap")),
    Package("faketime", Group.FAULTS, Path("/usr/bin/faketime")),
    Package("iptables", Group.FAULTS, Path("/usr/sbin/xtables-nft-multi")),  # iptables
    Package("wrk", Group.BENCH, Path("/usr/bin/wrk")),
)


def missing(groups: set[Group]) -> list[str]:
    """The packages of these groups that are not installed, in the list's order."""
    return [p.name for p in PACKAGES if p.group in groups and not p.installed()]


def ensure(groups: set[Group]) -> None:
    """Install the packages of these groups that are missing, and stop the services Debian
    starts on install (ours need their ports)."""
    wanted = missing(groups)
    if not wanted:
        return
    if os.geteuid() != 0:
        sys.exit(f"missing {' '.join(wanted)}: run as root to install them")
    print("installing", " ".join(wanted), flush=True)  # before apt-get's own lines
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *wanted], check=True, env=env)
    stop_system_services()


def stop_system_services() -> None:
    """Debian may start its own PostgreSQL, RabbitMQ and ZooKeeper on install."""
    for service in ("rabbitmq-server", "postgresql", "zookeeper"):
        if shutil.which("service"):
            subprocess.run(["service", service, "stop"], capture_output=True)


if __name__ == "__main__":
    ensure({Group(name) for name in sys.argv[1:]})
