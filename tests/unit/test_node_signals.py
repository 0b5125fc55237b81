"""``serve`` hands SIGTERM and SIGINT to the node while it runs and gives them back (their
defaults) once it has stopped: checked in a child process, since handlers are process-wide."""

from __future__ import annotations

import subprocess
import sys

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
