"""What handlers raise to steer a delivery, what the producer client raises, and what the
dead-letter operations raise."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from consumers_sdk.records import JobRecord


class Retry(Exception):
    """Retry this job after ``delay`` (overrides the handler's backoff)."""

    def __init__(self, delay: float | timedelta | None = None, reason: str = "retry requested"):
        super().__init__(reason)
        self.delay_s = delay.total_seconds() if isinstance(delay, timedelta) else delay


class Reject(Exception):
    """Send this job straight to the dead-letter queue; no retry."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HandlerTimeout(TimeoutError):
    """The handler ran past its timeout; this counts as a failed attempt."""


class ClientError(Exception):
    """The dispatcher refused or failed a request. Raised by ``schedule_many`` for a chunk after
    the first, ``stored`` holds the jobs the chunks before it stored."""

    def __init__(self, status: int, message: str, body: dict[str, object] | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.body = body or {}
        self.stored: tuple[JobRecord, ...] = ()


class AccessDenied(ClientError):
    """401/403: the API key is missing, not valid (or revoked), or its scope does not allow this."""


class InvalidJob(ClientError):
    """422/400/413: the job was refused; ``body["fields"]`` names the fields."""


class JobNotFound(ClientError):
    """404: no job has this id."""


class JobConflict(ClientError):
    """409: the job is no longer in a state that allows this; ``state`` says which."""

    @property
    def state(self) -> str | None:
        state = self.body.get("state")
        return state if isinstance(state, str) else None


class ScheduleNotFound(ClientError):
    """404: no schedule has this name (in the caller's namespace)."""


class ScheduleConflict(ClientError):
    """409: the name is taken, or the namespace holds as many schedules as it may
    (``body["error"]`` is ``conflict`` or ``limit_reached``)."""


class InvalidSchedule(ClientError):
    """422/400/413: the schedule was refused; ``body["fields"]`` names the fields."""


class FlowRuleNotFound(ClientError):
    """404: no flow rule has this key (in this namespace)."""


class FlowRuleConflict(ClientError):
    """409: the caller holds as many flow rules as the dispatcher allows it: an admin key
    ``DISPATCHER_MAX_FLOW_RULES`` with the others, a limits key
    ``DISPATCHER_MAX_FLOW_RULES_PER_NAMESPACE`` with its namespace's."""


class InvalidFlowRule(ClientError):
    """422/400: the rule was refused; ``body["fields"]`` names the fields."""


class BulkActionNotFound(ClientError):
    """404: no bulk action has this id (that this key may see)."""


class BulkActionConflict(ClientError):
    """409: the bulk action is not in a state that allows this (stop a running one, resume a
    stopped or failed one)."""


class InvalidBulkAction(ClientError):
    """422/400: the bulk action was refused; ``body["fields"]`` names the fields."""


class DispatcherUnavailable(ClientError):
    """503 or no connection, after every retry."""


class DlqError(Exception):
    """A dead-letter operation could not be done (no such queue, management API unreachable)."""


class BrokerToolError(DlqError):
    """A broker operation (dead letters, policies, the management API) could not be done."""


class TopologyMismatch(Exception):
    """A queue exists with arguments other than the ones this SDK declares (and other than an
    earlier release's): RabbitMQ refuses to change them in place."""

    def __init__(self, queue: str, declared: dict[str, object], refusal: str) -> None:
        super().__init__(
            f"queue {queue!r} exists with other arguments than {declared}; RabbitMQ said: "
            f"{refusal}. Delete the queue or give it these arguments with a policy."
        )
        self.queue = queue
        self.declared = declared
        self.refusal = refusal
