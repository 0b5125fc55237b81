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

Any role that may connect to the database may also send a notice on this channel, so a notice is
trusted for nothing but a hint: a time that is not finite or outside the years PostgreSQL and
Python share, a shard outside the cluster's, a routing key that is not one are refused (logged)
before they reach the heap, and what is kept only makes the owner try a claim that checks the row.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable
from typing import Final

from consumers_sdk import validation
from dispatcher.models import DueEntry, routing_key_of
from dispatcher.store.listen import ChannelListener

logger = logging.getLogger(__name__)

CHANNEL: Final = "dispatcher_due"
# The instants a job's run_at may hold: 0001-01-01 to 9999-12-31 UTC, in POSIX seconds.
EARLIEST_S: Final = -62135596800.0
LATEST_S: Final = 253402300799.0


def parse(payload: str, shard_count: int | None = None) -> DueEntry | None:
    """``'<job id>,<shard>,<run_at epoch seconds>[,<routing key>]'`` (a routing key has no comma);
    None for anything else, or a shard outside ``shard_count`` (logged)."""
    try:
        job_id, shard_text, run_at_text, *key = payload.split(",")
        if len(key) > 1:
            raise ValueError("too many fields")
        run_at_s, shard = float(run_at_text), int(shard_text)
        if not (math.isfinite(run_at_s) and EARLIEST_S <= run_at_s <= LATEST_S):
            raise ValueError("run_at out of range")
        if shard < 0 or (shard_count is not None and shard >= shard_count):
            raise ValueError("no such shard")
        if key and key[0] and validation.routing_key_problem(key[0]) is not None:
            raise ValueError("not a routing key")
        # No priority in a notice: such a job goes by its time alone until a load reads it.
        key_of = routing_key_of(key[0] if key else "")
        return DueEntry.make(run_at_s, uuid.UUID(job_id), shard, key_of)
    except ValueError as exc:
        logger.warning("ignoring a due notice (%s): %r", exc, payload[:200])
        return None


def subscribe(
    listener: ChannelListener,
    *,
    offer: Callable[[list[DueEntry]], None],
    on_connect: Callable[[], None],
    shard_count: int | None = None,
) -> None:
    """Offer every due notice that holds to ``offer``; ``on_connect`` after every (re)connect."""

    def notice(payload: str) -> None:
        entry = parse(payload, shard_count)
        if entry is not None:
            offer([entry])

    listener.subscribe(CHANNEL, on_notice=notice, on_connect=on_connect)
