"""Run by tests/e2e/test_stray_processes.py in a pytest of its own, whose worker it kills: one
test that starts processes of every kind a test run starts, writes their pids and waits.

Not collected by the suite (its name does not start with ``test_``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from devstack.postgres import PostgresServer
from devstack.zookeeper import ZooKeeperServer

PIDS = "STRANDED_PIDS"
# Starts a sleeper in a session of its own, prints its pid and exits: the sleeper is orphaned.
DAEMON = (
    "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', 'import time; "
    "time.sleep(600)'], start_new_session=True, stdout=subprocess.DEVNULL, "
    "stderr=subprocess.DEVNULL).pid)"
)


def test_start_processes_then_wait_to_be_killed(
    pg_server: PostgresServer, own_zookeeper: ZooKeeperServer
) -> None:
    # A process that leaves its parent's group and is orphaned at once, like a daemon.
    daemon = subprocess.run(
        [sys.executable, "-c", DAEMON], capture_output=True, text=True, check=True
    )
    # Its data folder is on this host: test_stray_processes.py runs this on the binaries.
    postmaster = (pg_server.data / "postmaster.pid").read_text().split()[0]
    assert own_zookeeper.is_running()
    java = (own_zookeeper.root / "zookeeper.pid").read_text()
    pids = {
        "worker": os.getpid(),
        "postgres": postmaster,
        "zookeeper": java,
        "daemon": daemon.stdout.strip(),
    }
    Path(os.environ[PIDS]).write_text("".join(f"{name} {pid}\n" for name, pid in pids.items()))
    time.sleep(600)
