"""A test run leaves nothing running, even when a pytest-xdist worker is killed in mid-test
(tests/support/reaping.py, devstack/reaper.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from devstack.base import alive, wait_until
from tests.support import stranded_worker
from tests.support.engine import SERVICES
from tests.support.process import ROOT


def test_a_killed_worker_leaves_none_of_its_processes_running(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    log = tmp_path / "inner.log"
    with log.open("wb") as out:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-n",
                "1",
                "--max-worker-restart=0",
                "-p",
                "no:cacheprovider",
                stranded_worker.__file__,
            ],
            cwd=ROOT,
            # The process reaper is under test: the inner run's PostgreSQL is a host process
            # (in a container, testcontainers' Ryuk removes it instead).
            env={**os.environ, stranded_worker.PIDS: str(pids_file), SERVICES: "binaries"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        assert wait_until(lambda: len(_read(pids_file)) == 4, 120), log.read_text()
        pids = _read(pids_file)
        assert all(alive(pid) for pid in pids.values()), pids

        os.kill(pids["worker"], signal.SIGKILL)

        assert wait_until(lambda: not any(alive(pid) for pid in pids.values()), 20), {
            name: pid for name, pid in pids.items() if alive(pid)
        }
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(10)


def _read(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    lines = [line.split() for line in path.read_text().splitlines()]
    return {name: int(pid) for name, pid in lines if len(lines) == 4}
