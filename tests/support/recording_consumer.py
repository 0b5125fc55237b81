"""A consumer process for kill -9 tests: appends ``start <id> <redelivered>`` when a handler
begins and ``done <id> <epoch seconds>`` when it returns (just before the ack) to RESULTS_FILE."""

import asyncio
import os
import time

from consumers_sdk import Consumer, Job

consumer = Consumer(os.environ["AMQP_URL"], group="crashy", prefetch=int(os.environ["PREFETCH"]))


def record(line: str) -> None:
    with open(os.environ["RESULTS_FILE"], "a") as results:  # one small append, then closed
        results.write(f"{line}\n")


@consumer.handler("crash.work", timeout=10.0)
async def work(job: Job) -> None:
    record(f"start {job.id} {int(job.message.redelivered or False)}")
    await asyncio.sleep(0.2)
    record(f"done {job.id} {time.time():.6f}")
