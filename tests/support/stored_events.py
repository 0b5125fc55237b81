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
    consumer reports them (no round: as for a job dispatched before rounds), written as the
    dispatcher writes every batch (``shared.note_rows``)."""
    return shared.note_rows(
        "(SELECT gen_random_uuid() AS event_id, planted.*, NULL::uuid AS round,"
        f" NULL::text AS ignored FROM ({rows}) AS planted) AS planted"
    )
