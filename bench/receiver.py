"""A consumer in its own process: appends "job_id received_at" for every delivery to a file, so
the benchmark process's own work does not distort the times. Stops on SIGTERM.

It is kept light, since it shares the cores with what it measures: deliveries are taken on the
aiormq channel without aio-pika's per-message wrappers, acknowledged by the broker on sending
(no_ack; a benchmark loses nothing by it), on uvloop.

    python -m bench.receiver AMQP_URL BINDING OUTPUT_FILE
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from typing import cast

import aio_pika
import aiormq
import aiormq.abc
import uvloop
from aio_pika.abc import FieldValue

from consumers_sdk import contract


async def main(amqp_url: str, binding: str, output: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    lines: list[str] = []
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    exchange = await channel.declare_exchange(
        contract.EXCHANGE,
        aio_pika.ExchangeType.TOPIC,
        durable=True,
        arguments=dict[str, FieldValue](contract.exchange_arguments()),
    )
    # A queue per binding: receivers with different bindings must not share one.
    queue = await channel.declare_queue(f"bench.receiver.{binding}", durable=True)
    await queue.bind(exchange, binding)

    async def on(message: aiormq.abc.DeliveredMessage) -> None:
        lines.append(f"{message.header.properties.message_id} {time.time():.6f}\n")

    amqp = cast(aiormq.Channel, await channel.get_underlay_channel())
    await amqp.basic_consume(queue.name, on, no_ack=True)
    print("ready", flush=True)
    with open(output, "a") as out:  # noqa: ASYNC230 - a local file, flushed once a second
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            out.writelines(lines)
            out.flush()
            lines.clear()
    await connection.close()


if __name__ == "__main__":
    uvloop.run(main(*sys.argv[1:4]))
