"""Opening AMQP connections so that a cancelled open leaves nothing behind.

A cancellation that lands inside aio-pika's ``connect_robust`` can be swallowed (it finishes
connecting anyway) or leave the half-made connection's socket open with no object to close it
by; a node or consumer asked to stop while the broker answers would leave that connection open.
``opened`` lets a cancelled open finish for a moment and closes what it opened before passing
the cancellation on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aio_pika.abc import AbstractConnection

Connection = TypeVar("Connection", bound=AbstractConnection)
CLOSE_LATE_S = 5.0  # how long a cancelled open may take to finish, and be closed


async def opened(connect: Callable[[], Awaitable[Connection]]) -> Connection:
    attempt: asyncio.Future[Connection] = asyncio.ensure_future(connect())
    try:
        return await asyncio.shield(attempt)
    except asyncio.CancelledError:
        # Not cancelled in its turn: an open cancelled half-way can leave its socket open with
        # no object to close it by. It finishes (or fails), then what it opened is closed.
        with contextlib.suppress(BaseException):
            await asyncio.wait({attempt}, timeout=CLOSE_LATE_S)
        if not attempt.done():
            attempt.cancel()
        elif not attempt.cancelled() and attempt.exception() is None:
            with contextlib.suppress(Exception):
                await attempt.result().close()
        raise
