"""The SDK's pytest plugin (the ``consumers_sdk`` entry point of ``pytest11``): the testing
helpers as fixtures, so a project's tests can take them without importing anything.

    async def test_expiry(dispatcher_job, run_handler):
        outcome = await run_handler(consumer, "orders.expire", dispatcher_job({"order": 1}))
        assert outcome.kind == "acked"

Disable it with ``-p no:consumers_sdk``.
"""

from __future__ import annotations

import pytest

from consumers_sdk import testing


@pytest.fixture
def dispatcher_job() -> testing.JobFactory:
    """``make_job``: a Job as a handler receives it (payload, headers=, attempt=, ...)."""
    return testing.make_job


@pytest.fixture
def run_handler() -> testing.HandlerRunner:
    """``run_handler(consumer, routing_key, job)``: the Outcome of one attempt."""
    return testing.run_handler


# The recording client's fixture exists where its module does.
try:
    from consumers_sdk.testing.fake_client import (  # type: ignore[import-not-found, unused-ignore]
        RecordingClient,
    )
except ImportError:
    pass
else:

    @pytest.fixture
    def recording_client() -> RecordingClient:
        """A fresh ``RecordingClient``: what the code under test scheduled, cancelled and
        rescheduled, with no dispatcher."""
        return RecordingClient()
