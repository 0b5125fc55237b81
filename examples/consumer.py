"""Expires orders when their expiry job fires.

python -m consumers_sdk examples.consumer:consumer     # against `make run`'s RabbitMQ

Reads DISPATCHER_AMQP_URL, the name the dispatcher and the `dispatcher` command read too.
"""

import os

from consumers_sdk import Consumer, Job, polynomial

consumer = Consumer(
    os.environ.get("DISPATCHER_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
    group="billing",
    prefetch=32,
)


@consumer.handler("orders.expire", max_attempts=5, timeout=30.0, backoff=polynomial(15, 3600))
async def expire_order(job: Job) -> None:
    # Idempotent on the job id: a redelivery must not expire the order twice.
    print(
        f"expiring order {job.payload['order']} (job {job.id}, attempt {job.attempt})", flush=True
    )
