"""Due notices: jobs made ``scheduled`` outside this node's intake reach its heap at once.

A reschedule (on any node), a dependency released by a consumer's event or a job enqueued in an
application's own transaction may fall inside a window some node has already loaded; the loader
would find it only at its safety sweep. The statements that do this call
``dispatcher_notify_due_v1`` (sql/0012) in their transaction (delivered on commit only). This
module owns the rest of the contract: the channel, the parser of the text (built by that SQL
function alone, so its format changes in these two places; an older SDK builds the same text
itself and the parser keeps accepting it), and the subscription on the node's one LISTEN
connection (``store.listen``) that offers each job to the loader, which keeps it only if the shard
is owned here and the time inside the loaded window.

Notices are not durable: while the connection is down some may be missed, so every (re)connect
moves the loader's window back by the sweep grace (the jobs are loaded again; a duplicate entry
costs one claim that finds nothing).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Final

from dispatcher.models import DueEntry, routing_key_of
from dispatcher.store.listen import ChannelListener

logger = logging.getLogger(__name__)

CHANNEL: Final = "dispatcher_due"


def parse(payload: str) -> DueEntry | None:
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


def subscribe(
    listener: ChannelListener,
    *,
    offer: Callable[[list[DueEntry]], None],
    on_connect: Callable[[], None],
) -> None:
    """Offer every due notice to ``offer``; ``on_connect`` after every (re)connect."""

    def notice(payload: str) -> None:
        entry = parse(payload)
        if entry is not None:
            offer([entry])

    listener.subscribe(CHANNEL, on_notice=notice, on_connect=on_connect)
