"""An SDK consumer as a user runs it (default settings, outcome events on): its handler appends
"job_id seconds-late" for each job, lateness taken inside the handler (now - the job's run_at).
Prints "ready" once consuming; stops on SIGTERM.

    python -m bench.handler_consumer AMQP_URL ROUTING_KEY OUTPUT_FILE [--no-events]
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import uvloop

from consumers_sdk import Consumer, Job


async def main(amqp_url: str, routing_key: str, output: str, events: bool) -> None:
    consumer = Consumer(amqp_url, group="bench", report_events=events)
    lines: list[str] = []

    @consumer.handler(routing_key)
    async def record(job: Job) -> None:
        run_at = job.run_at.timestamp() if job.run_at is not None else float("nan")
        lines.append(f"{job.id} {time.time() - run_at:.6f}\n")

    async def flush() -> None:
        await consumer.ready.wait()
        print("ready", flush=True)
        with open(output, "a") as out:  # noqa: ASYNC230 - a local file, flushed once a second
            while True:
                await asyncio.sleep(1.0)
                out.writelines(lines)
                out.flush()
                lines.clear()

    flusher = asyncio.create_task(flush())
    try:
        await consumer.run()
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        with open(output, "a") as out:  # noqa: ASYNC230 - the last lines, once, at exit
            out.writelines(lines)


if __name__ == "__main__":
    amqp_url, routing_key, output = sys.argv[1:4]
    uvloop.run(main(amqp_url, routing_key, output, events="--no-events" not in sys.argv[4:]))
