"""Dispatcher nodes: in the background for `make cluster` (one process per node, its log and pid
file under ROOT/nodes/), or `make run`'s one node in the foreground (its pid file too), all
stopped by `make down` from those pid files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import httpx

from devstack import tenants
from devstack.base import tail, wait_until
from devstack.ports import wait_port_free
from devstack.stack import Urls

READY_S = 120.0  # a loaded two-core machine starts three nodes slowly
STACKS_S = 1.0  # a node writes its stacks at once; the log is read this long after asking
STACK_LINES = 200  # a node's threads' stacks, and the lines before them
STOP_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeProcess:
    name: str
    http_port: int
    pid: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def folder(root: Path) -> Path:
    return root / "nodes"


def settings_env(urls: Urls) -> dict[str, str]:
    """The DISPATCHER_* variables that point a node (or `dispatcher migrate`) at the services."""
    return {
        "DISPATCHER_DATABASE_URL": urls.database_url,
        "DISPATCHER_AMQP_URL": urls.amqp_url,
        "DISPATCHER_ZK_HOSTS": urls.zk_hosts,
        # The management API of the node `up` started (guest may log in from this machine).
        "DISPATCHER_AMQP_MANAGEMENT_URL": urls.management_url.replace("://", "://guest:guest@", 1),
        # Events count only from a user granted the job: the tenants `up` made, and guest.
        "DISPATCHER_EVENT_USERS": tenants.event_users(),
    }


def migrate(urls: Urls) -> None:
    subprocess.run(
        [sys.executable, "-m", "dispatcher", "migrate"],
        env={**os.environ, **settings_env(urls)},
        check=True,
    )


def node_env(urls: Urls, name: str, http_port: int) -> dict[str, str]:
    return {
        **os.environ,
        **settings_env(urls),
        "DISPATCHER_NODE_ID": name,
        "DISPATCHER_HTTP_HOST": "127.0.0.1",
        "DISPATCHER_HTTP_PORT": str(http_port),
    }


def record(root: Path, name: str, pid: int, http_port: int) -> None:
    nodes = folder(root)
    nodes.mkdir(parents=True, exist_ok=True)
    (nodes / f"{name}.pid").write_text(f"{pid} {http_port}\n")


def serve(root: Path, urls: Urls, name: str, http_port: int) -> NoReturn:
    """Become the node, in the foreground (Ctrl-C stops it), recorded so `make down` stops it
    too: the pid stays the same across exec."""
    record(root, name, os.getpid(), http_port)
    sys.stdout.flush()
    os.execve(
        sys.executable,
        [sys.executable, "-m", "dispatcher", "serve"],
        node_env(urls, name, http_port),
    )


def spawn(
    env: Mapping[str, str], log: Path, *, group: int | None = None
) -> subprocess.Popen[bytes]:
    """``python -m dispatcher serve`` in a session of its own (signalled as a group, detached
    from the terminal), its output appended to ``log``; GROUP: the group id it runs under (a
    firewall rule on its packets can then cut it from one service: ``firewall``)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dispatcher", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            group=group,
        )


def start(root: Path, urls: Urls, name: str, http_port: int) -> NodeProcess:
    """Start one node detached from this command; its pid file is what `stop_all` reads."""
    nodes = folder(root)
    nodes.mkdir(parents=True, exist_ok=True)
    log = nodes / f"{name}.log"
    process = spawn(node_env(urls, name, http_port), log)
    record(root, name, process.pid, http_port)
    return NodeProcess(name=name, http_port=http_port, pid=process.pid, log=log)


def ready(node: NodeProcess) -> bool:
    try:
        return httpx.get(f"{node.url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(node: NodeProcess) -> None:
    if not wait_until(lambda: not alive(node.pid) or ready(node), READY_S) or not ready(node):
        sys.exit(f"{node.name} is not ready after {READY_S:.0f}s: {not_ready(node)}")


def not_ready(node: NodeProcess) -> str:
    """Why NODE is not ready, for the operator: what /readyz answers, or whether the process
    has gone. A node still running writes to its log first its threads' stacks (SIGUSR1) and
    what each of its tasks awaits (SIGUSR2, once its loop runs): the tail shows where it waits."""
    if not alive(node.pid):
        state = "the process has exited"
    else:
        state = f"the process runs; /readyz: {readyz(node)}"
        with contextlib.suppress(ProcessLookupError):
            for asked in (signal.SIGUSR1, signal.SIGUSR2):
                os.kill(node.pid, asked)
                time.sleep(STACKS_S)
    return f"{state}\n{node.log}:\n{tail(node.log, STACK_LINES)}"


def readyz(node: NodeProcess) -> str:
    try:
        response = httpx.get(f"{node.url}/readyz", timeout=5)
    except httpx.HTTPError as exc:
        return f"no answer ({exc!r})"
    return f"{response.status_code} {response.text[:2000]}"


def alive(pid: int) -> bool:
    """A dispatcher process by this pid still runs (not a zombie, not a recycled pid)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return b"dispatcher" in cmdline and "\nState:\tZ" not in status


def signal_group(pid: int, sig: int) -> None:
    """A background node leads its own process group; `make run`'s node does not (it is make's)."""
    with contextlib.suppress(ProcessLookupError):  # it exited in the meantime
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop(pid: int) -> None:
    signal_group(pid, signal.SIGTERM)
    if not wait_until(lambda: not alive(pid), STOP_S):
        signal_group(pid, signal.SIGKILL)
        wait_until(lambda: not alive(pid), STOP_S)


def stop_all(root: Path) -> list[str]:
    """SIGTERM every recorded node, SIGKILL what outlives STOP_S; returns the names stopped."""
    stopped = []
    for pid_file in sorted(folder(root).glob("*.pid")):
        pid, http_port = (int(word) for word in pid_file.read_text().split())
        if alive(pid):
            stop(pid)
            stopped.append(pid_file.stem)
        wait_port_free(http_port)
        pid_file.unlink()
    return stopped


def running(root: Path) -> list[str]:
    return [
        pid_file.stem
        for pid_file in sorted(folder(root).glob("*.pid"))
        if alive(int(pid_file.read_text().split()[0]))
    ]
