"""A node serves HTTP only on the uvicorn release its guards were written for: a real process
that finds another release installed exits with code 1 and says which one it found and which one
it needs, before it binds its port or retries anything; on the installed release it serves."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx

from devstack.dispatcher_process import DispatcherProcess
from devstack.ports import reserve_port
from dispatcher.api import internals
from tests.support.process import spawn

OTHER_RELEASE = "0.54.1"  # a patch release: the kind the old range let in without the guards


def installed_as(folder: Path, version: str) -> str:
    """A folder that, put first on PYTHONPATH, makes ``importlib.metadata`` report uvicorn
    VERSION; the code imported stays the installed one (only its release number differs)."""
    info = folder / f"uvicorn-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: uvicorn\nVersion: {version}\n")
    return str(folder)


def test_a_node_on_another_uvicorn_release_refuses_to_start_and_says_why(
    tmp_path: Path, database_url: str, amqp_url: str
) -> None:
    port = reserve_port()
    shim = installed_as(tmp_path / "shim", OTHER_RELEASE)
    path = os.pathsep.join(p for p in (shim, os.environ.get("PYTHONPATH", "")) if p)
    log = tmp_path / "node.log"
    process = spawn(
        ["-m", "dispatcher", "serve"],
        env={
            "PYTHONPATH": path,
            "DISPATCHER_DATABASE_URL": database_url,
            "DISPATCHER_AMQP_URL": amqp_url,
            "DISPATCHER_HTTP_PORT": str(port),
        },
        log=log,
    )
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    output = log.read_text()
    assert code == 1, output
    assert (
        f"dispatcher: the HTTP server cannot start: uvicorn {OTHER_RELEASE} is installed and "
        f"the HTTP edge supports uvicorn {internals.TESTED_UVICORN}"
    ) in output
    assert f"install uvicorn=={internals.TESTED_UVICORN}" in output
    assert "stock protocol" not in output
    assert "trying again" not in output  # refused before any service was tried
    with socket.socket() as probe:  # never bound
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_node_on_the_installed_uvicorn_serves(dispatcher: DispatcherProcess) -> None:
    answer = httpx.get(f"{dispatcher.url}/healthz", timeout=10)
    assert answer.status_code == 200
