"""The Celery side of bench/versus_celery.py: one task that records when it ran."""

import os
import time

from celery import Celery

app = Celery("bench", broker=os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


@app.task(name="bench.record")  # type: ignore[untyped-decorator]
def record(job_id: str) -> None:
    with open(os.environ["RESULTS_FILE"], "a") as results:
        results.write(f"{job_id} {time.time():.6f}\n")
