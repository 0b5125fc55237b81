"""Due notices: the channel and the text ``dispatcher_notify_due_v1`` (sql/0012) sends on it.

The text is built by that SQL function alone (the dispatcher's statements, the 0010 follow-up and
the SDK's ``enqueue`` all call it) and read back here alone, so its format changes in these two
places. ``store.listen`` owns the connection that LISTENs; ``scheduler.wakeups`` hands the parsed
entries to the loader. An older SDK builds the same text itself: the parser keeps accepting it.
"""

from __future__ import annotations

import logging
import uuid
from typing import Final

from dispatcher.models import DueEntry, routing_key_of

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
