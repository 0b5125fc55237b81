"""An SDK consumer with a no-op handler, default settings otherwise: it counts the jobs it handled
and writes "count first_at last_at" to a file once a second. Prints "ready" once consuming; stops
on SIGTERM.

    python -m bench.noop_consumer AMQP_URL ROUTING_KEY OUTPUT_FILE [--no-events]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import uvloop

from consumers_sdk import Consumer, Job


async def main(amqp_url: str, routing_key: str, output: Path, events: bool) -> None:
    consumer = Consumer(amqp_url, group="bench", report_events=events)
    handled = [0, 0.0, 0.0]  # count, first, last

    @consumer.handler(routing_key)
    async def noop(job: Job) -> None:
        now = time.time()
        handled[0] += 1
        handled[1] = handled[1] or now
        handled[2] = now

    async def report() -> None:
        await consumer.ready.wait()
        print("ready", flush=True)
        while True:
            await asyncio.sleep(1.0)
            line = f"{handled[0]} {handled[1]:.6f} {handled[2]:.6f}\n"
            output.write_text(line)  # noqa: ASYNC240 - a few bytes to a local file, once a second

    reporter = asyncio.create_task(report())
    try:
        await consumer.run()
    finally:
        reporter.cancel()


if __name__ == "__main__":
    amqp_url, routing_key, output = sys.argv[1:4]
    uvloop.run(main(amqp_url, routing_key, Path(output), events="--no-events" not in sys.argv[4:]))
