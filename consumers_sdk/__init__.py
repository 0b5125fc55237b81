"""What consumer teams import: a Consumer that pulls, acks and retries through RabbitMQ, the Job
it hands to handlers, a producer client, and the message contract shared with the dispatcher."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from consumers_sdk import contract
    from consumers_sdk.client import DispatcherClient
    from consumers_sdk.consumer import Consumer
    from consumers_sdk.dedup import Deduplicator, MemoryDeduplicator
    from consumers_sdk.errors import (
        AccessDenied,
        ClientError,
        DispatcherUnavailable,
        HandlerTimeout,
        InvalidJob,
        InvalidSchedule,
        JobConflict,
        JobNotFound,
        Reject,
        Retry,
        ScheduleConflict,
        ScheduleNotFound,
    )
    from consumers_sdk.job import Job
    from consumers_sdk.records import (
        HistoryEntry,
        JobPage,
        JobRecord,
        JobTemplate,
        Schedule,
        SchedulePage,
    )
    from consumers_sdk.retry import exponential, polynomial
    from consumers_sdk.sync_client import SyncDispatcherClient

# Each public name and the module it lives in, imported when first asked for (PEP 562): a module of
# the package (``validation``, ``ids``, ``calls``...) loads without the consumer, the HTTP client
# and their drivers, so the dispatcher's pure core imports it with its pure dependencies alone.
_HOMES = {
    "contract": "consumers_sdk.contract",
    "DispatcherClient": "consumers_sdk.client",
    "Consumer": "consumers_sdk.consumer",
    "Deduplicator": "consumers_sdk.dedup",
    "MemoryDeduplicator": "consumers_sdk.dedup",
    **dict.fromkeys(
        [
            "AccessDenied",
            "ClientError",
            "DispatcherUnavailable",
            "HandlerTimeout",
            "InvalidJob",
            "InvalidSchedule",
            "JobConflict",
            "JobNotFound",
            "Reject",
            "Retry",
            "ScheduleConflict",
            "ScheduleNotFound",
        ],
        "consumers_sdk.errors",
    ),
    "Job": "consumers_sdk.job",
    **dict.fromkeys(
        ["HistoryEntry", "JobPage", "JobRecord", "JobTemplate", "Schedule", "SchedulePage"],
        "consumers_sdk.records",
    ),
    "exponential": "consumers_sdk.retry",
    "polynomial": "consumers_sdk.retry",
    "SyncDispatcherClient": "consumers_sdk.sync_client",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'consumers_sdk' has no attribute {name!r}")
    module = importlib.import_module(home)
    found = module if home.rsplit(".", 1)[1] == name else getattr(module, name)
    globals()[name] = found  # asked once
    return found


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AccessDenied",
    "ClientError",
    "Consumer",
    "Deduplicator",
    "DispatcherClient",
    "DispatcherUnavailable",
    "HandlerTimeout",
    "HistoryEntry",
    "InvalidJob",
    "InvalidSchedule",
    "Job",
    "JobConflict",
    "JobNotFound",
    "JobPage",
    "JobRecord",
    "JobTemplate",
    "MemoryDeduplicator",
    "Reject",
    "Retry",
    "Schedule",
    "ScheduleConflict",
    "ScheduleNotFound",
    "SchedulePage",
    "SyncDispatcherClient",
    "contract",
    "exponential",
    "polynomial",
]
