"""Schedules order expiries through the dispatcher's API.

python -m examples.producer 5      # against `make run`'s dispatcher on :8080

Reads DISPATCHER_URL and DISPATCHER_API_KEY (when the dispatcher requires keys), the names the
`dispatcher` command reads too.
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
            job = await expire_order.schedule(
                {"order": order},
                delay=timedelta(seconds=1),
                idempotency_key=f"order-{order}-expiry",
            )
            print(f"scheduled {job.id} for order {order} at {job.run_at}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
