"""A node as this process's whole purpose (``dispatcher serve``): signals stop it, SIGUSR2 writes
what each of its tasks awaits, and the cyclic collector is tuned for a long-lived heap."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from typing import TextIO

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
    loop.add_signal_handler(DUMP_SIGNAL, write_awaits)
    try:
        await node.run()
    finally:
        for signum in (*STOP_SIGNALS, DUMP_SIGNAL):
            loop.remove_signal_handler(signum)


# `kill -USR2 PID`: what each task awaits, to stderr (SIGUSR1 writes the threads' stacks, even
# when the loop itself is stuck: ``dispatcher serve``). devstack asks for both when a node it
# started is not ready in time.
DUMP_SIGNAL = signal.SIGUSR2


def write_awaits(out: TextIO | None = None) -> None:
    """Every task of the running loop, and the chain of awaits it is suspended in, innermost
    last (a task's own stack shows only its outermost coroutine)."""
    out = out or sys.stderr
    tasks = sorted(asyncio.all_tasks(), key=lambda task: task.get_name())
    print(f"awaits of {len(tasks)} tasks:", file=out)
    for task in tasks:
        print(f"task {task.get_name()}:", file=out)
        for place in awaits(task.get_coro()):
            print(f"  {place}", file=out)
    out.flush()


def awaits(coro: object) -> list[str]:
    """FILE:LINE in FUNCTION for each coroutine (or generator) the awaits from CORO reach."""
    places = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            places.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return places


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
