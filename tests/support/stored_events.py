"""The events stored in ``event_batches`` (sql/0025) as rows, for tests that read or plant them
directly: ``STORED_EVENTS`` is a FROM item with ``job_events``' columns (one row per event, in the
order received: ``batch``, then ``position``)."""

from __future__ import annotations

from typing import Final

from dispatcher.store.queries import shared

STORED_EVENTS: Final = f"""(
    SELECT b.id AS batch, b.recorded_at, e.* FROM {shared.EVENT_ENTRIES}
) AS job_events"""


def plant_events(rows: str) -> str:
    """An INSERT of one event batch from ``rows``, a query whose columns are ``job_id``,
    ``outcome``, ``attempt``, ``consumer_group``, ``consumer``, ``error`` and ``at``, as a
    consumer reports them (no round: as for a job dispatched before rounds)."""
    return f"""
INSERT INTO event_batches (job_keys, event_ids, job_ids, outcomes, attempts, consumer_groups,
                           consumers, errors, ats, rounds, ignored, details)
SELECT array_agg(DISTINCT dispatcher_id_key(job_id)), array_agg(gen_random_uuid()),
       array_agg(job_id), array_agg(outcome), array_agg(attempt), array_agg(consumer_group),
       array_agg(consumer), array_agg(error), array_agg(at), array_agg(NULL::uuid),
       array_agg(NULL::text), array_agg(NULL::text)
FROM ({rows}) AS planted
HAVING count(*) > 0
"""
