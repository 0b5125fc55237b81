"""A throwaway RabbitMQ node (with the management plugin) from /usr/lib/rabbitmq/bin, as root."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from urllib.parse import quote

import httpx

from devstack import reaper
from devstack.base import ServiceError, kill_group, recorded_pid, tail, wait_until
from devstack.ports import reserve_ports, wait_port_free

BIN = Path("/usr/lib/rabbitmq/bin")
READY_S = 90.0
STOP_S = 60.0  # a node stops its queues and writes its state before it exits
# How many `rabbitmqctl` runs one process may have at once (the size of RabbitMQ's own range).
CTL_PORT_COUNT = 11
_ctl_ports: dict[int, range] = {}
# What every node here runs with, wherever it runs (tests/support/containers.py gives a container
# the same): guest may sign in from any address (the tests and the console use it), and tests
# restart nodes often: no waiting for big disk headroom.
SHARED_CONFIG = "loopback_users = none\ndisk_free_limit.absolute = 50MB\n"


def ctl_ports() -> range:
    """The distribution ports this process's `rabbitmqctl` runs listen on. RabbitMQ's default,
    35672-35682, is one range for every process and lies where the kernel picks ephemeral
    ports, so a server handed one of them could find it taken by a CLI run."""
    pid = os.getpid()
    if pid not in _ctl_ports:
        _ctl_ports[pid] = reserve_ports(CTL_PORT_COUNT)
    return _ctl_ports[pid]


class RabbitServer:
    major = 3  # Debian 12's RabbitMQ 3.10

    def __init__(
        self, root: Path, amqp_port: int, mgmt_port: int, dist_port: int, nodename: str
    ) -> None:
        self.root = root
        self.amqp_port = amqp_port
        self.mgmt_port = mgmt_port
        self.dist_port = dist_port
        self.nodename = nodename
        self.mgmt_url = f"http://127.0.0.1:{mgmt_port}"
        self.out = root / "server.out"
        self.config_lines = ""  # more of rabbitmq.conf (a cluster's settings, say)
        self._process: subprocess.Popen[bytes] | None = None
        self.starts = 0  # how many times start() ran: a test can tell it was restarted
        self.mark = reaper.current()  # the node belongs to the scope that made it (reaper.py)

    def command(self, tool: str) -> list[str]:
        """How to run one of RabbitMQ's scripts (another install may run them elsewhere)."""
        return [str(BIN / tool)]

    def node_path(self, path: Path) -> str:
        """PATH, a file under root, as the node's scripts see it."""
        return str(path)

    @property
    def env(self) -> dict[str, str]:
        at = self.node_path
        return {
            **reaper.marked(self.mark),
            "HOME": at(self.root),  # the Erlang cookie lives here; rabbitmqctl needs the same
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_MNESIA_BASE": at(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": at(self.root / "log"),
            "RABBITMQ_CONFIG_FILE": at(self.root / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": at(self.root / "enabled_plugins"),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_PID_FILE": at(self.root / "rabbitmq.pid"),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(ctl_ports().start),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(ctl_ports()[-1]),
        }

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Write the node's config and start its process; ``wait_ready`` waits for it."""
        self.starts += 1
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            f"management.tcp.port = {self.mgmt_port}\n"
            "management.tcp.ip = 127.0.0.1\n"
            + SHARED_CONFIG
            + self.extra_config()
            + self.config_lines
        )
        (self.root / "enabled_plugins").write_text("[rabbitmq_management].\n")
        with self.out.open("ab") as out:
            self._process = subprocess.Popen(
                self.command("rabbitmq-server"),
                env=self.env,
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        if not wait_until(self._ready, READY_S):
            self.kill()
            raise ServiceError("rabbitmq", f"not ready after {READY_S}s", self.logs())

    def extra_config(self) -> str:
        """Lines another release's node adds to rabbitmq.conf."""
        return ""

    def connection_names(self, vhost: str) -> list[str]:
        """The client-provided names of the vhost's connections, from the node itself (the
        management API lists connections only with its metrics on)."""
        return connection_names_in(self.ctl(*LIST_CONNECTIONS), vhost)

    def _ready(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            raise ServiceError("rabbitmq", "exited during start", self.logs())
        return amqp_answers(self.amqp_port) and management_answers(self.mgmt_url)

    def ctl(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(
            [*self.command("rabbitmqctl"), "-n", self.nodename, *args],
            env=self.env,
            capture_output=True,
            text=True,
        )
        if check and result.returncode != 0:
            raise ServiceError(
                "rabbitmq", f"rabbitmqctl {args} failed: {result.stderr}", self.logs()
            )
        return result.stdout

    def running_nodes(self) -> set[str]:
        """The nodes of its cluster this node sees running, from its management API (a
        ``rabbitmqctl cluster_status`` would boot an Erlang VM each time: half a CPU-second)."""
        try:
            response = httpx.get(f"{self.mgmt_url}/api/nodes", auth=("guest", "guest"), timeout=10)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise ServiceError("rabbitmq", f"no answer to /api/nodes: {exc}", "") from exc
        return {str(node["name"]) for node in response.json() if node.get("running")}

    def stop(self) -> None:
        """A graceful stop: SIGTERM to the Erlang VM, which RabbitMQ takes as ``rabbitmqctl stop``
        (the CLI boots a VM of its own, half a CPU-second; and the start script's own SIGTERM
        trap runs it, so the process group is signalled only for what outlives the VM)."""
        if self.is_running():
            assert self._process is not None
            if (vm := recorded_pid(self.root / "rabbitmq.pid")) is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(vm, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(STOP_S)
            kill_group(self._process, signal.SIGTERM)
        self._process = None
        wait_port_free(self.amqp_port)

    def kill(self) -> None:
        """A crash: SIGKILL to the node's process group (epmd, shared by nodes, is left alone)."""
        kill_group(self._process)
        self._process = None
        wait_port_free(self.amqp_port)

    def stop_app(self) -> None:
        """A broker outage that keeps the Erlang process."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        self.ctl("start_app")
        if not wait_until(self._ready, READY_S):
            raise ServiceError("rabbitmq", "not ready after start_app", self.logs())

    def restart(self) -> None:
        self.stop()
        self.start()

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def url(self, vhost: str = "/") -> str:
        return guest_url(self.amqp_port, vhost)

    def create_vhost(self, name: str) -> None:
        create_vhost(self.mgmt_url, name)

    def delete_vhost(self, name: str) -> None:
        delete_vhost(self.mgmt_url, name)

    def logs(self) -> str:
        logs = sorted((self.root / "log").glob("*.log")) if (self.root / "log").exists() else []
        # The node's own log says why; the script's output only when it failed to start one.
        return "\n".join([tail(path) for path in logs] or [tail(self.out)])


# Below, what a node answers wherever it runs (tests/support/containers.py asks a container's).
# `rabbitmqctl` arguments that list each connection's vhost and client properties.
LIST_CONNECTIONS = ("list_connections", "vhost", "client_properties", "--formatter", "json")


def connection_names_in(listed: str, vhost: str) -> list[str]:
    """The client-provided names of VHOST's connections in LISTED, the JSON that
    ``rabbitmqctl`` prints for LIST_CONNECTIONS."""
    names = []
    for connection in json.loads(listed or "[]"):
        if connection.get("vhost") != vhost:
            continue
        properties = connection.get("client_properties") or []
        # [["connection_name", "longstr", "name"], ...] (a list of triples in the JSON)
        for entry in properties:
            if isinstance(entry, list) and entry and entry[0] == "connection_name":
                names.append(str(entry[-1]))
    return names


def guest_url(amqp_port: int, vhost: str = "/") -> str:
    return f"amqp://guest:guest@127.0.0.1:{amqp_port}/{quote(vhost, safe='')}"


def amqp_answers(amqp_port: int) -> bool:
    """Whether a broker on 127.0.0.1:AMQP_PORT answers the protocol header."""
    with socket.socket() as sock:
        sock.settimeout(1)
        if sock.connect_ex(("127.0.0.1", amqp_port)) != 0:
            return False
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        try:
            return sock.recv(8)[:1] == b"\x01"  # a Connection.Start frame
        except OSError:
            return False


def management_answers(mgmt_url: str) -> bool:
    try:
        response = httpx.get(f"{mgmt_url}/api/overview", auth=("guest", "guest"))
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def create_vhost(mgmt_url: str, name: str) -> None:
    """NAME, with every permission for guest."""
    vhost = quote(name, safe="")
    with httpx.Client(base_url=mgmt_url, auth=("guest", "guest"), timeout=30) as http:
        http.put(f"/api/vhosts/{vhost}").raise_for_status()
        http.put(
            f"/api/permissions/{vhost}/guest",
            json={"configure": ".*", "write": ".*", "read": ".*"},
        ).raise_for_status()


def delete_vhost(mgmt_url: str, name: str) -> None:
    with httpx.Client(base_url=mgmt_url, auth=("guest", "guest"), timeout=30) as http:
        http.delete(f"/api/vhosts/{quote(name, safe='')}")
