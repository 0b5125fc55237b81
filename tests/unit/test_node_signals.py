"""``serve`` hands SIGTERM and SIGINT to the node while it runs and gives them back (their
defaults) once it has stopped, and a node asked where it waits (SIGUSR1, SIGUSR2) says so and
runs on: checked in child processes, since handlers are process-wide."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from devstack import nodes
from devstack.base import tail, wait_until
from devstack.ports import reserve_port
from devstack.stack import Urls

SCRIPT = """
import asyncio, os, signal
from dispatcher import node
from dispatcher.settings import Settings

async def main():
    loop = asyncio.get_running_loop()
    # No database answers on port 1: the node waits to start until the signal stops it.
    loop.call_later(0.5, os.kill, os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(node.serve(Settings(database_url="postgresql://127.0.0.1:1/none")), 30)
    print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    print(loop.remove_signal_handler(signal.SIGTERM))  # False: none left to remove

asyncio.run(main())
"""


def test_serving_stops_on_sigterm_and_leaves_the_default_handlers() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True", "False"]


def test_a_node_that_is_not_ready_writes_where_it_waits_and_runs_on(tmp_path: Path) -> None:
    """devstack's report on a node not ready in time: the node's threads (SIGUSR1) and the awaits
    of its tasks (SIGUSR2), written to its log by the node itself, which then runs on."""
    nowhere = Urls(
        database_url="postgresql://postgres@127.0.0.1:1/none",  # refused: the start retries
        amqp_url="amqp://guest:guest@127.0.0.1:1/",
        management_url="http://127.0.0.1:1",
        zk_hosts="",
    )
    port, log = reserve_port(), tmp_path / "node-1.log"
    process = nodes.spawn(nodes.node_env(nowhere, "node-1", port), log)
    node = nodes.NodeProcess(name="node-1", http_port=port, pid=process.pid, log=log)
    try:
        assert wait_until(lambda: "starting:" in tail(node.log), 60), tail(node.log)
        told = nodes.not_ready(node)
        assert told.startswith("the process runs; /readyz: no answer"), told
        assert "Current thread" in told, told  # the threads' stacks
        assert re.search(
            r"^task .*:\n(  .*\n)*  .*/dispatcher/node/root\.py:\d+ in _start$", told, re.M
        )
        assert nodes.alive(node.pid)
    finally:
        process.terminate()
        assert process.wait(30) == 0  # it ran on, and stopped as asked
