"""The dispatcher's exceptions. Each docstring is the default message; ``api.problems`` maps them
to HTTP answers. Driver errors (asyncpg, aiormq, kazoo) are translated where the driver is owned."""

from __future__ import annotations


class DispatcherError(Exception):
    """The dispatcher failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class Fatal(DispatcherError):
    """The node cannot run with this configuration or database; a restart will not help."""


class StoreUnavailable(DispatcherError):
    """PostgreSQL is unreachable or did not answer in time."""


class JobNotFound(DispatcherError):
    """No job has this id."""


class InvalidEvent(DispatcherError):
    """PostgreSQL refused a consumer's event (a value it cannot store)."""


class JobRefused(DispatcherError):
    """PostgreSQL refused a job (a value it cannot store)."""


class JobStateConflict(DispatcherError):
    """The job is no longer in a state that allows this."""

    def __init__(self, state: str, message: str | None = None) -> None:
        super().__init__(message or f"the job is {state}")
        self.state = state


class Unauthenticated(DispatcherError):
    """A valid API key is required: send it as 'Authorization: Bearer <key>'."""


class Forbidden(DispatcherError):
    """This API key's scope does not allow this."""

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class PayloadTooLarge(DispatcherError):
    """The payload exceeds the configured limit."""

    def __init__(self, field: str, size: int, limit: int) -> None:
        super().__init__(f"{field} is {size} bytes encoded; the limit is {limit}")
        self.field = field


class InvalidField(DispatcherError):
    """A field breaks a configured limit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


class KeyConflict(DispatcherError):
    """A field names something another caller holds (409)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


class ShardCountMismatch(Fatal):
    """The configured shard count differs from the one this database was created with."""


class CoordinationUnavailable(DispatcherError):
    """ZooKeeper is unreachable, or this node's session is not valid."""


class ZkAccessDenied(Fatal):
    """ZooKeeper refused this node's credentials (DISPATCHER_ZK_AUTH)."""


class MigrationError(Fatal):
    """A migration could not be applied."""


class FramedPublishUnsupported(Fatal):
    """Framed publishing was required, but the installed aiormq does not support it."""


class HttpServerUnsupported(Fatal):
    """The installed uvicorn is not the release the HTTP edge's guards were written for."""


class BrokerUnavailable(DispatcherError):
    """RabbitMQ is unreachable."""


class PublishFailed(DispatcherError):
    """RabbitMQ did not confirm the publish."""


class InvalidPrerequisite(DispatcherError):
    """A job named in ``after`` cannot be waited for."""

    def __init__(self, job_index: int, after_index: int, message: str) -> None:
        super().__init__(f"after[{after_index}]: {message}")
        self.job_index = job_index  # the job's position in the submission
        self.after_index = after_index
        self.detail = message


class IdempotencyKeyTaken(DispatcherError):
    """The idempotency key is held by a job outside this API key's routing-key prefixes."""

    def __init__(self, job_index: int) -> None:
        super().__init__()
        self.job_index = job_index  # the job's position in the submission


class ScheduleNotFound(DispatcherError):
    """No schedule has this name in this namespace."""


class ScheduleExists(DispatcherError):
    """A schedule of this name exists in this namespace."""


class ScheduleLimitReached(DispatcherError):
    """This namespace has as many schedules as DISPATCHER_MAX_SCHEDULES_PER_NAMESPACE allows."""


class ScheduleQuotaReached(DispatcherError):
    """This namespace's active schedules would make more jobs than
    DISPATCHER_MAX_SCHEDULE_JOBS_PER_MINUTE allows."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field  # the timing field of the schedule that would pass the quota


class FlowRuleNotFound(DispatcherError):
    """No flow rule has this key in this namespace."""


class BulkActionNotFound(DispatcherError):
    """No bulk action has this id (that this key may see)."""


class Busy(DispatcherError):
    """This node is doing as much of this as it does at once: retry later."""

    def __init__(self, message: str | None = None, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BulkLimitReached(DispatcherError):
    """This namespace has as many bulk actions as DISPATCHER_BULK_MAX_RUNNING or
    DISPATCHER_BULK_MAX_STORED allows."""


class BulkBatchTooSlow(DispatcherError):
    """A bulk action's batch took longer than DISPATCHER_BULK_BATCH_TIMEOUT_S."""


class FlowRuleLimitReached(DispatcherError):
    """As many flow rules exist as the caller's cap allows (DISPATCHER_MAX_FLOW_RULES for the
    operators, DISPATCHER_MAX_FLOW_RULES_PER_NAMESPACE for each namespace's limits keys)."""


class FlowRuleOwned(Forbidden):
    """This flow rule is an operator's: only an admin key may change it."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, field="key")


# What the services raise while they are away: a loop retries these after a backoff, quietly.
TRANSIENT: tuple[type[DispatcherError], ...] = (
    StoreUnavailable,
    CoordinationUnavailable,
    BrokerUnavailable,
    PublishFailed,
)
