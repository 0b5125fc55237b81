"""A dispatcher node as a real process (``python -m dispatcher serve``) that a test or a benchmark
starts, waits for, kills, pauses and stops; started through ``nodes.spawn``, the launcher
``make cluster`` uses too, or forked by a launcher the test suite installs (its zygote)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import httpx

from devstack import nodes
from devstack.base import LOG_TAIL_LINES

# Short leases and few shards: a claim cut off by a crash fires again within seconds.
FAST_LEASE = {"DISPATCHER_LEASE_S": "3", "DISPATCHER_SHARD_COUNT": "32"}


class Launched(Protocol):
    """A started node: a ``subprocess.Popen`` or a process forked for it."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, signum: int) -> None: ...


# Forks a node from (environment, log) faster than a new interpreter starts, or answers None
# when it cannot (then the node is spawned): the test suite installs one (tests/support/zygote.py).
Fork = Callable[[Mapping[str, str], Path], Launched | None]
_fork: Fork | None = None


def fork_with(fork: Fork | None) -> None:
    global _fork
    _fork = fork


class DispatcherProcess:
    def __init__(
        self,
        log_dir: Path,
        *,
        port: int,
        env: dict[str, str],
        name: str = "node",
        api_key: str | None = None,
        group: int | None = None,
    ) -> None:
        """GROUP: the group id the process runs under (a firewall rule on its packets can then
        cut it from one service: ``firewall``)."""
        self.port = port
        self.group = group
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self._env = {
            **os.environ,
            "DISPATCHER_HTTP_PORT": str(port),
            "DISPATCHER_NODE_ID": name,
            **env,
        }
        self._log_path = log_dir / f"dispatcher-{name}.log"
        self.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._process: Launched | None = None

    def start(self, *, ready_timeout: float = 30.0, ready: bool = True) -> None:
        """Start, and wait until ``/readyz`` says ready (or, READY false, until it answers at
        all: a node a test expects not to be ready)."""
        forked = None
        if self.group is None and _fork is not None:
            forked = _fork(self._env, self._log_path)
        self._process = forked or nodes.spawn(self._env, self._log_path, group=self.group)
        self.wait_ready(ready_timeout, answering_is_enough=not ready)

    def wait_ready(self, timeout: float, *, answering_is_enough: bool = False) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.logs()}")
            try:
                status = httpx.get(f"{self.url}/readyz", headers=self.auth, timeout=1).status_code
                if status == 200 or (answering_is_enough and status == 503):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout}s:\n{self.logs()}")

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def kill(self) -> None:
        """kill -9: no shutdown code runs."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: a graceful stop."""
        assert self._process is not None
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        return self._process.wait(timeout)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def logs(self, tail: int = LOG_TAIL_LINES) -> str:
        if not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-tail:])

    def stop(self) -> None:
        if self.is_running():
            try:
                self.terminate(10)
            except subprocess.TimeoutExpired:
                self.kill()
