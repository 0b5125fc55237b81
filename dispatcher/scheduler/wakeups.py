"""Due notices: jobs made ``scheduled`` outside this node's intake reach its heap at once.

A reschedule (on any node), a dependency released by a consumer's event or a job enqueued in an
application's own transaction may fall inside a window some node has already loaded; the loader
would find it only at its safety sweep. The statements that do this call
``pg_notify(DUE_CHANNEL, 'id,shard,epoch_seconds')`` in their transaction (delivered on commit
only), and every node listens on a dedicated connection and offers the job to its loader, which
keeps it only if the shard is owned here and the time inside the loaded window.

Notices are not durable: while the connection is down some may be missed, so every (re)connect
moves the loader's window back by the sweep grace (the jobs are loaded again; a duplicate entry
costs one claim that finds nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Final

from dispatcher import errors
from dispatcher.models import DueEntry, routing_key_of
from dispatcher.store import db, queries
from dispatcher.store.db import Database

logger = logging.getLogger(__name__)

DUE_CHANNEL: Final = "dispatcher_due"
RECONNECT_MAX_S = 5.0
PING_EVERY_S = 5.0  # a connection that died without a word (no FIN) is noticed this fast


def parse_notice(payload: str) -> DueEntry | None:
    """``'<job id>,<shard>,<run_at epoch seconds>[,<routing key>]'`` (a routing key has no comma);
    None for anything else (logged)."""
    try:
        job_id, shard, run_at_s, *key = payload.split(",")
        if len(key) > 1:
            raise ValueError("too many fields")
        return DueEntry(
            float(run_at_s), uuid.UUID(job_id), int(shard), routing_key_of(key[0] if key else "")
        )
    except ValueError:
        logger.warning("ignoring a malformed due notice %r", payload[:200])
        return None


class DueListener:
    def __init__(
        self,
        db: Database,
        *,
        offer: Callable[[list[DueEntry]], None],
        on_connect: Callable[[], None],
    ) -> None:
        self._db = db
        self._offer = offer
        self._on_connect = on_connect

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self._listen()
                failures = 0
            except errors.StoreUnavailable as exc:
                failures += 1
                delay = min(0.25 * 2**failures, RECONNECT_MAX_S)
                logger.warning("due notices: %s; reconnecting in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    async def _listen(self) -> None:
        """Listen until the connection is lost."""
        connection = await self._db.dedicated()
        lost = asyncio.Event()
        connection.add_termination_listener(lambda _connection: lost.set())
        try:
            with db.translated():
                await connection.add_listener(DUE_CHANNEL, self._notice)
                self._on_connect()
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), PING_EVERY_S)
                        break
                    await connection.fetchval(queries.PING, timeout=self._db.timeout_s)
            logger.warning("due notices: connection lost")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2.0)

    def _notice(self, _connection: object, _pid: int, _channel: str, payload: object) -> None:
        entry = parse_notice(str(payload))
        if entry is not None:
            self._offer([entry])
