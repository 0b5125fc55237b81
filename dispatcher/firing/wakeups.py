"""Due notices: jobs made ``scheduled`` outside this node's intake reach its heap at once.

A reschedule (on any node), a dependency released by a consumer's event or a job enqueued in an
application's own transaction may fall inside a window some node has already loaded; the loader
would find it only at its safety sweep. The statements that do this call
``dispatcher_notify_due_v1`` in their transaction (delivered on commit only; the channel and the
text belong to ``store.due_notices``), and every node listens (``store.listen``, the node's one
LISTEN connection) and offers the job to its loader, which keeps it only if the shard is owned
here and the time inside the loaded window.

Notices are not durable: while the connection is down some may be missed, so every (re)connect
moves the loader's window back by the sweep grace (the jobs are loaded again; a duplicate entry
costs one claim that finds nothing).
"""

from __future__ import annotations

from collections.abc import Callable

from dispatcher.models import DueEntry
from dispatcher.store import due_notices
from dispatcher.store.listen import ChannelListener


def subscribe(
    listener: ChannelListener,
    *,
    offer: Callable[[list[DueEntry]], None],
    on_connect: Callable[[], None],
) -> None:
    """Offer every due notice to ``offer``; ``on_connect`` after every (re)connect."""

    def notice(payload: str) -> None:
        entry = due_notices.parse(payload)
        if entry is not None:
            offer([entry])

    listener.subscribe(due_notices.CHANNEL, on_notice=notice, on_connect=on_connect)
