"""A cancelled AMQP open leaves no connection behind, wherever the cancellation lands."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import unquote, urlsplit

import aio_pika

from consumers_sdk import connections
from devstack.rabbitmq import RabbitServer
from tests.support.waiting import eventually

NAME = "cancelled-open"
TRIES = 30
STEPS = 3  # event loop turns between two tries' cancellations


async def test_an_open_cancelled_at_any_moment_leaves_no_connection_open(
    amqp_url: str, rabbit_server: RabbitServer
) -> None:
    vhost = unquote(urlsplit(amqp_url).path.lstrip("/"))

    def connect() -> asyncio.Task[aio_pika.abc.AbstractRobustConnection]:
        return asyncio.create_task(
            connections.opened(
                lambda: aio_pika.connect_robust(
                    amqp_url, client_properties={"connection_name": NAME}
                )
            )
        )

    opens = []
    for attempt in range(TRIES):
        opening = connect()
        for _ in range(attempt * STEPS):  # cancelled after more of the open each time
            await asyncio.sleep(0)
        opening.cancel()
        opens.append(opening)
    finished = await asyncio.gather(*opens, return_exceptions=True)
    cancelled = sum(isinstance(result, asyncio.CancelledError) for result in finished)
    for result in finished:  # the ones that opened before their cancellation are ours to close
        if isinstance(result, aio_pika.abc.AbstractConnection):
            with contextlib.suppress(Exception):
                await result.close()
    assert cancelled >= 1

    def none_open() -> bool:
        return NAME not in rabbit_server.connection_names(vhost)

    await eventually(none_open, 20, poll_s=0.5)
