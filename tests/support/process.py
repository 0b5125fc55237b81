"""A dispatcher node as a real process (``python -m dispatcher serve``) for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from devstack.base import LOG_TAIL_LINES

if TYPE_CHECKING:
    from tests.support.zygote import Forked

ROOT = Path(__file__).parents[2]

# Short leases and few shards: a claim cut off by a crash fires again within seconds.
FAST_LEASE = {"DISPATCHER_LEASE_S": "3", "DISPATCHER_SHARD_COUNT": "32"}


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
        self._process: subprocess.Popen[bytes] | Forked | None = None

    def start(self, *, ready_timeout: float = 30.0, ready: bool = True) -> None:
        """Start, and wait until ``/readyz`` says ready (or, READY false, until it answers at
        all: a node a test expects not to be ready)."""
        # Imported here: conftest imports this module before pytest registers the zygote plugin.
        from tests.support import zygote

        if self.group is None and zygote.available() and zygote.forkable(self._env):
            self._process = zygote.zygote().fork("dispatcher", ["serve"], self._env, self._log_path)
        else:
            with self._log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "dispatcher", "serve"],
                    env=self._env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    group=self.group,
                )
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


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``python <args>`` from the project root, in its own session, output appended to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def served(
    log_dir: Path,
    database_url: str,
    amqp_url: str,
    *,
    env: dict[str, str] | None = None,
    api_key: str | None = None,
    group: int | None = None,
) -> Iterator[DispatcherProcess]:
    """A started dispatcher on a free port for a fixture to yield from; stopped afterwards."""
    from devstack.ports import reserve_port

    process = DispatcherProcess(
        log_dir,
        port=reserve_port(),
        env={
            "DISPATCHER_DATABASE_URL": database_url,
            "DISPATCHER_AMQP_URL": amqp_url,
            **(env or {}),
        },
        api_key=api_key,
        group=group,
    )
    process.start()
    yield process
    print(process.logs())  # shown when the test fails
    process.stop()
