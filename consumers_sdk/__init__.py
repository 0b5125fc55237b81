"""What consumer teams import: a Consumer that pulls, acks and retries through RabbitMQ, the Job
it hands to handlers, a producer client, and the message contract shared with the dispatcher."""

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
