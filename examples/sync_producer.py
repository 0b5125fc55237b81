"""Schedules order expiries without asyncio, as a Django or Flask view or a script would.

python -m examples.sync_producer 5      # against `make run`'s dispatcher on :8080

Reads DISPATCHER_URL and DISPATCHER_API_KEY (when the dispatcher requires keys), the names the
`dispatcher` command reads too.
"""

import os
import sys

from consumers_sdk import SyncDispatcherClient


def main(count: int) -> None:
    with SyncDispatcherClient(
        os.environ.get("DISPATCHER_URL", "http://127.0.0.1:8080"),
        api_key=os.environ.get("DISPATCHER_API_KEY"),
    ) as client:
        for order in range(count):
            job = client.schedule(
                "orders.expire",
                {"order": order},
                delay=1.0,  # seconds, or a timedelta
                idempotency_key=f"order-{order}-expiry-sync",
            )
            print(f"scheduled {job.id} for order {order} at {job.run_at}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
