"""Schedules order expiries through the dispatcher's API.

python -m examples.producer 5      # against `make run`'s dispatcher on :8080

Reads DISPATCHER_URL and DISPATCHER_API_KEY (when the dispatcher requires keys), the names the
`dispatcher` command reads too. Run it again: an order whose expiry job has finished (succeeded
or dead) gets a new one, an order whose job has not keeps that job.
"""

import asyncio
import os
import sys
from datetime import timedelta

from consumers_sdk import DispatcherClient


async def main(count: int) -> None:
    async with DispatcherClient(
        os.environ.get("DISPATCHER_URL", "http://127.0.0.1:8080"),
        api_key=os.environ.get("DISPATCHER_API_KEY"),
    ) as client:

        @client.job("orders.expire")
        def expire_order(order: int) -> None:  # callable locally too; scheduled it runs elsewhere
            print(f"would expire {order} here")

        for order in range(count):
            key = f"order-{order}-expiry"
            job = await expire_order.schedule(
                {"order": order},
                delay=timedelta(seconds=1),
                idempotency_key=key,  # a retried run schedules nothing twice...
                release_key="finished",  # ...and the key is free again once its job finished
            )
            said = f"created job {job.id}, due {job.run_at}"
            if job.outcome != "created":  # kept: the job its key names has not finished
                said = f"{job.outcome} job {job.id}, {job.state}: its key {key} is still held"
            print(f"order {order}: {said}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
