"""How fast one SDK consumer process drains ready jobs: 100 000 jobs waiting in its work queue,
a no-op handler, default settings, outcome events on and off; against the raw ceiling of one
aio-pika consumer acking each message (prefetch 500) in the same run, on a queue of the same type.

    .venv/bin/python -m bench.consumer_throughput [--jobs 100000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
from aio_pika.abc import FieldValue

from bench import harness
from bench.harness import median, services_with_node, started, stopped, write
from bench.throughput import ceiling_consume
from consumers_sdk import contract, topology
from devstack.jobs_out import job
from dispatcher.amqp.publisher import message_properties

ROUTING_KEY = "bench.noop"
CHUNK = 2000  # publishes in flight at once while filling


async def fill(amqp_url: str, routing_key: str, count: int, exchange: str) -> None:
    """COUNT job messages, as the dispatcher publishes them, routed by ROUTING_KEY; confirmed."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        amqp = await channel.get_underlay_channel()
        for first in range(0, count, CHUNK):
            items = [job(routing_key, n) for n in range(first, min(first + CHUNK, count))]
            await asyncio.gather(
                *(
                    amqp.basic_publish(
                        item.payload,
                        exchange=exchange,
                        routing_key=item.routing_key,
                        properties=message_properties(item, datetime.now(UTC)),
                    )
                    for item in items
                )
            )
    finally:
        await connection.close()


async def sdk_rate(amqp_url: str, folder: Path, count: int, events: bool) -> float:
    """Jobs/s one consumer process handled, from its first job to its last."""
    output = folder / f"noop-{events}-{time.monotonic_ns()}.txt"
    flag = [] if events else ["--no-events"]
    stopped(started("bench.noop_consumer", amqp_url, ROUTING_KEY, str(output), *flag))  # declare
    await fill(amqp_url, ROUTING_KEY, count, contract.EXCHANGE)
    consumer = started("bench.noop_consumer", amqp_url, ROUTING_KEY, str(output), *flag)
    try:
        while True:
            await asyncio.sleep(1.0)
            fields = output.read_text().split() if output.exists() else []
            if len(fields) != 3:  # not written yet, or caught mid-write
                continue
            handled, first, last = fields
            if int(handled) >= count:
                return count / (float(last) - float(first))
    finally:
        stopped(consumer)


async def raw_rate(amqp_url: str, count: int) -> float:
    """One aio-pika consumer acking each message, on a quorum queue like the SDK's work queue."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(
            "bench.raw", aio_pika.ExchangeType.DIRECT, durable=True
        )
        arguments = dict[str, FieldValue](topology.work_arguments("bench.raw", "quorum"))
        queue = await channel.declare_queue("bench.raw", durable=True, arguments=arguments)
        await queue.bind(exchange, ROUTING_KEY)
        await fill(amqp_url, ROUTING_KEY, count, "bench.raw")
        return await ceiling_consume(channel, queue.name, count)
    finally:
        await connection.close()


async def main(jobs: int, runs: int) -> None:
    figures: dict[str, list[float]] = {"raw": [], "events_on": [], "events_off": []}
    with services_with_node() as (svc, folder, _):  # the node takes the outcome events
        for _ in range(runs):  # interleaved, so drift touches each alike
            figures["raw"].append(await raw_rate(svc.amqp_url, jobs))
            figures["events_on"].append(await sdk_rate(svc.amqp_url, folder, jobs, True))
            figures["events_off"].append(await sdk_rate(svc.amqp_url, folder, jobs, False))
    medians = {name: median(values) for name, values in figures.items()}
    print(f"One consumer process, {jobs} ready jobs, no-op handler (median of {runs})")
    for name in ("raw", "events_on", "events_off"):
        share = medians[name] / medians["raw"] * 100
        each = ", ".join(f"{value:.0f}" for value in figures[name])
        print(f"  {name:10} {medians[name]:8.0f} jobs/s  {share:5.1f}% of raw  ({each})")
    results = {"jobs": jobs, "runs": runs, "figures": figures, "medians": medians}
    print(f"  written to {write('consumer_throughput', results)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    harness.run(main(args.jobs, args.runs))
