"""Test handlers without a broker: ``make_job`` builds the Job a handler receives, and
``run_handler`` runs a consumer's registered handler on it once and says what the consumer would
do with the delivery (an ``Outcome``), by the same rules the consumer runs.

Test code that schedules without a dispatcher: ``RecordingClient`` and ``RecordingSyncClient`` are
the real clients with the dispatcher held in memory, keeping what was scheduled, cancelled and
rescheduled.

The pytest plugin (``consumers_sdk.testing.plugin``, registered by the SDK's distribution) gives
them as the fixtures ``dispatcher_job``, ``run_handler`` and ``recording_client``. Importing
this package does not import pytest.
"""

from collections.abc import Awaitable, Callable

from consumers_sdk.consumer import Consumer
from consumers_sdk.job import Job
from consumers_sdk.outcome import Outcome
from consumers_sdk.testing.fake_client import RecordingClient, RecordingSyncClient
from consumers_sdk.testing.handlers import handler_for, run_handler
from consumers_sdk.testing.jobs import make_job

# The fixtures' types, for annotating a test's parameters.
JobFactory = Callable[..., Job]
HandlerRunner = Callable[[Consumer, str, Job], Awaitable[Outcome]]

__all__ = [
    "HandlerRunner",
    "JobFactory",
    "Outcome",
    "RecordingClient",
    "RecordingSyncClient",
    "handler_for",
    "make_job",
    "run_handler",
]
