"""Real processes for end-to-end tests: a started node for a fixture (``served``), any
``python -m`` command (``spawn``). The node itself is ``devstack.dispatcher_process``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from devstack.dispatcher_process import DispatcherProcess

ROOT = Path(__file__).parents[2]


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
