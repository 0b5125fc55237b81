"""A consumer process for kill -9 tests: records each job it handled in RESULTS_FILE."""

import asyncio
import os

from consumers_sdk import Consumer, Job

consumer = Consumer(os.environ["AMQP_URL"], group="crashy", prefetch=5)


@consumer.handler("crash.work", timeout=10.0)
async def work(job: Job) -> None:
    await asyncio.sleep(0.2)
    with open(os.environ["RESULTS_FILE"], "a") as results:  # noqa: ASYNC230 - tiny test record
        results.write(f"{job.id}\n")
