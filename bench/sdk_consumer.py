"""The dispatcher side of bench/versus_celery.py: an SDK consumer that records when each job ran."""

import os
import time

from consumers_sdk import Consumer, Job

consumer = Consumer(os.environ["AMQP_URL"], group="bench", prefetch=64)


@consumer.handler("bench.versus")
def record(job: Job) -> None:
    with open(os.environ["RESULTS_FILE"], "a") as results:
        # The benchmark's own id travels as the idempotency key.
        results.write(f"{job.idempotency_key or job.id} {time.time():.6f}\n")
