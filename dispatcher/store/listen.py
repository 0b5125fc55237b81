"""ChannelListener: one dedicated PostgreSQL connection that LISTENs on several channels.

Each channel has a callback for its notices and one for every (re)connect. NOTIFY is not durable:
what was sent while the connection was down is lost, so the connect callback is where a
subscriber catches up (the loader moves its window back, the keyring drops its caches). It runs
after every LISTEN is in place, so nothing sent afterwards is missed.

``run`` runs supervised (``dispatcher.node``): while PostgreSQL is away its error reaches the
supervisor, which shows the loop degraded in ``/readyz`` and runs it again with backoff; a
connect callback that raises restarts the loop too (and with it every subscriber's catch-up); a
notice callback that raises is logged with its traceback and the next notice is delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.store import db
from dispatcher.store.db import Database
from dispatcher.store.queries import connection as queries

logger = logging.getLogger(__name__)

# The pace of the supervisor's restarts while PostgreSQL is away (the loop's task row).
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 5.0
PING_EVERY_S = 5.0  # a connection that died without a word (no FIN) is noticed this fast


@dataclass(frozen=True, slots=True)
class _Subscription:
    on_notice: Callable[[str], None]
    on_connect: Callable[[], None]


class ChannelListener:
    def __init__(self, database: Database, *, name: str) -> None:
        self._db = database
        self._name = name  # the connection's application_name
        self._channels: dict[str, _Subscription] = {}

    def subscribe(
        self, channel: str, *, on_notice: Callable[[str], None], on_connect: Callable[[], None]
    ) -> None:
        """Before ``run``: ``on_notice(payload)`` for each notice, ``on_connect()`` after every
        (re)connect. Both run on the loop and must not block."""
        self._channels[channel] = _Subscription(on_notice, on_connect)

    async def run(self) -> None:
        """Listen, reconnecting at once after a lost connection. ``StoreUnavailable`` (no
        connection to be had) reaches the supervisor, which shows the loop degraded and runs it
        again after a pause (``RECONNECT_FIRST_S`` doubling to ``RECONNECT_MAX_S``): nothing here
        outlives a connection."""
        while True:
            await self._listen()

    async def _listen(self) -> None:
        """Listen until the connection is lost."""
        connection = await self._db.dedicated(self._name)
        lost = asyncio.Event()
        connection.add_termination_listener(lambda _connection: lost.set())
        try:
            with db.translated():
                for channel, subscription in self._channels.items():
                    await connection.add_listener(channel, _deliver(subscription.on_notice))
                for subscription in self._channels.values():
                    subscription.on_connect()
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), PING_EVERY_S)
                        break
                    await connection.fetchval(queries.PING, timeout=self._db.timeout_s)
            logger.warning("notices: connection lost")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2.0)


def _deliver(on_notice: Callable[[str], None]) -> Callable[[object, int, str, object], None]:
    """asyncpg's listener signature, reduced to the payload; one bad notice stays alone."""

    def deliver(_connection: object, _pid: int, channel: str, payload: object) -> None:
        try:
            on_notice(str(payload))
        except Exception:
            logger.exception("notices: %s: %r not handled", channel, str(payload)[:200])

    return deliver
