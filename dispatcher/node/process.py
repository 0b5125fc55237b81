"""A node as this process's whole purpose (``dispatcher serve``): signals stop it, and the cyclic
collector is tuned for a long-lived heap."""

from __future__ import annotations

import asyncio
import gc
import signal

from dispatcher.node.root import Node
from dispatcher.settings import Settings

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def serve(settings: Settings) -> None:
    """Run a node until SIGTERM or SIGINT. The handlers are the loop's while the node runs and
    removed once it has stopped (the signals' defaults again), as the SDK's consumer runner does."""
    node = Node(settings)
    tune_gc()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, node.request_stop)
    try:
        await node.run()
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


# The cyclic collector's full passes walked every object the process holds (the imported
# frameworks, the heap of due jobs): 40-50 ms each, about once a second at 5k jobs/s, and firing
# stalled meanwhile (measured with gc.callbacks). What exists once the node is built is frozen out
# of the passes, and the young generation is collected less often, so full passes are rare.
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    """Process-wide: called by ``serve`` only, never by a node embedded in another program."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
