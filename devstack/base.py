"""What every service controller shares: a root folder, log tails, readiness by deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


class ServiceError(RuntimeError):
    def __init__(self, name: str, message: str, logs: str = "") -> None:
        super().__init__(f"{name}: {message}\n--- {name} log tail ---\n{logs}")


# What a failure shows of one server's log: enough to name the cause, little enough that the
# failing test's own assertion stays the part a reader sees first.
LOG_TAIL_LINES = 25


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_until(check: Callable[[], bool], deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.1)
    return False


def alive(pid: int) -> bool:
    """Running (a zombie is not: its parent may simply not have reaped it yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def recorded_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def kill_group(process: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    """Signal a process started with start_new_session=True and everything it started."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def service_root(name: str) -> Path:
    """A fresh folder that the postgres user can reach (pytest's own tmp tree is root-only)."""
    root = Path(tempfile.mkdtemp(prefix=f"dispatcher-{name}-"))
    root.chmod(0o755)
    return root


def run_as_postgres(args: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args
