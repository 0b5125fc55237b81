# Generated from consumers_sdk/client.py by `make sdk-sync` (python sdk/unasync.py): do not edit.
# Change client.py and regenerate; tests/unit/test_unasync.py fails while the two differ.
"""SyncDispatcherClient: ``DispatcherClient``'s methods and records for code without an event
loop (Django and Flask views, scripts), on httpx's sync client; ``list`` returns an iterator.
Generated from ``client.py``: the requests, the retry rules and the errors are the async client's
own (``calls``, ``exchange``).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, ParamSpec, Self, TypeVar, Unpack

import httpx

from consumers_sdk import calls, errors, exchange, records, schedulable

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
# Earlier names, kept for existing imports: the options, the body of one job, the result (a dict
# before records; a ``JobRecord`` now), the decorator's result and the defaults.
JobOptions = calls.JobOptions
job_body = calls.job_body
JobView = records.JobRecord
SchedulableJob = schedulable.SchedulableJob
DEFAULT_URL = exchange.DEFAULT_URL
BATCH_LIMIT = exchange.BATCH_LIMIT


class SyncDispatcherClient:
    """Schedule, read, list, move, cancel and requeue jobs; ``schedules`` for recurring ones.

    4xx answers raise typed errors (``ClientError`` and its family) at once; 503 and failed
    connections are retried ``retries`` times with backoff, a lost answer only when a replay is
    harmless. Durations are a ``timedelta`` or seconds. Open one per process (it holds a
    connection pool) and ``close()`` it, or use it as a context manager (``with``)."""

    def __init__(
        self,
        base_url: str = exchange.DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        retries: int = 5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        options = exchange.client_options(base_url, api_key, timeout_s)
        self._http = httpx.Client(**options, transport=transport)
        self._retries = retries
        self.schedules = SyncSchedules(self)
        self.limits = SyncLimits(self)
        self.bulk = SyncBulkActions(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def schedule(
        self, routing_key: str, payload: Any, **options: Unpack[calls.JobOptions]
    ) -> records.JobRecord:
        """Schedule one job: ``delay=`` or ``run_at=``, ``idempotency_key=``, ``headers=``,
        ``priority=``, ``ttl=``, ``after=``, ``max_attempts=``, ``retry_backoff=``,
        ``on_existing=``, ``release_key=``. A known idempotency key returns the job stored
        earlier (``created`` False), kept, or replaced or extended as ``on_existing`` asks
        (``outcome``)."""
        return self._run(calls.schedule(routing_key, payload, **options))

    def schedule_many(
        self, jobs: Sequence[Mapping[str, Any]], *, chunk_size: int = exchange.BATCH_LIMIT
    ) -> builtins.list[records.JobRecord]:
        """Schedule ``job_body(...)`` items in chunks of ``chunk_size`` (at most the node's
        ``DISPATCHER_MAX_BATCH``), each stored all or nothing; each record's ``outcome`` says
        what its item did. When a chunk fails, the chunks before it stay stored: the error's
        ``stored`` holds their jobs."""
        stored: builtins.list[records.JobRecord] = []
        for offset, chunk in exchange.chunks(jobs, chunk_size):
            try:
                batch = self._run(calls.schedule_batch(chunk))
            except errors.ClientError as refused:
                raise exchange.partly_stored(refused, stored, offset) from None
            stored.extend(batch)
        return stored

    def get(self, job_id: str) -> records.JobRecord:
        """The job with its history, and the jobs it waits for."""
        return self._run(calls.get(job_id))

    def list_page(
        self, *, after: str | None = None, limit: int = 100, **filters: Unpack[calls.JobFilters]
    ) -> records.JobPage:
        """One page of jobs in creation order (``state="scheduled"``: in due order), filtered by
        ``state=``, ``routing_key=`` (or ``routing_key_prefix=``) or ``idempotency_key=`` as
        ``GET /v1/jobs``; ``next_after`` is the next page's ``after``."""
        return self._run(calls.page(after=after, limit=limit, **filters))

    def list(
        self, *, page_size: int = 100, **filters: Unpack[calls.JobFilters]
    ) -> Iterator[records.JobRecord]:
        """Every job matching the filters, page after page: ``for job in client.list()``."""
        after: str | None = None
        while True:
            page = self.list_page(after=after, limit=page_size, **filters)
            yield from page.jobs
            if page.next_after is None:
                return
            after = page.next_after

    def reschedule(self, job_id: str, **change: Unpack[calls.JobChange]) -> records.JobRecord:
        """Move a job that has not fired to ``delay=``/``run_at=``, and/or change its
        ``payload=`` or ``priority=``; ``JobConflict`` once it is being dispatched or done."""
        return self._run(calls.reschedule(job_id, **change))

    def cancel(self, job_id: str) -> records.JobRecord:
        """Cancel a scheduled or waiting job; ``JobConflict`` (with ``.state``) past that."""
        return self._run(calls.cancel(job_id))

    def requeue(self, job_id: str) -> records.JobRecord:
        """A dead job back to ``scheduled``, due now, attempts afresh (an admin key's right);
        ``JobConflict`` unless it is dead."""
        return self._run(calls.requeue(job_id))

    def job(
        self, routing_key: str, **defaults: Unpack[calls.JobOptions]
    ) -> Callable[
        [Callable[P, R]],
        schedulable.SchedulableJob[P, R, records.JobRecord],
    ]:
        """Decorate a function so that ``fn.schedule(payload, delay=...)`` schedules it."""

        def wrap(
            function: Callable[P, R],
        ) -> schedulable.SchedulableJob[P, R, records.JobRecord]:
            return schedulable.SchedulableJob(self, routing_key, function, defaults)

        return wrap

    def _run(self, call: calls.Call[T]) -> T:
        steps = exchange.attempts(call, retries=self._retries)
        step = next(steps)
        while not isinstance(step, exchange.Done):
            if step:
                time.sleep(step)
            outcome: exchange.Outcome
            try:
                outcome = self._http.request(**exchange.request_options(call))
            except httpx.TransportError as failed:
                outcome = failed
            step = steps.send(outcome)
        return step.value


class SyncSchedules:
    """``client.schedules``: recurring schedules, each occurrence made an ordinary job."""

    def __init__(self, client: SyncDispatcherClient) -> None:
        self._client = client

    def create(
        self, name: str, routing_key: str, payload: Any, **options: Unpack[calls.ScheduleOptions]
    ) -> records.Schedule:
        """A schedule named ``name`` (unique in the namespace: ``ScheduleConflict``) with
        ``cron=`` (in ``timezone=``) or ``interval=``; ``ScheduleConflict`` also when the
        namespace holds as many as it may."""
        call = calls.create_schedule(name, routing_key, payload, **options)
        return self._client._run(call)

    def get(self, name: str) -> records.Schedule:
        """The schedule with its ``upcoming`` occurrences."""
        return self._client._run(calls.get_schedule(name))

    def list_page(self, *, after: int = 0, limit: int = 100) -> records.SchedulePage:
        return self._client._run(calls.schedule_page(after=after, limit=limit))

    def list(self, *, page_size: int = 100) -> Iterator[records.Schedule]:
        """Every schedule of the namespace (an admin's: of all), in creation order."""
        after = 0
        while True:
            page = self.list_page(after=after, limit=page_size)
            yield from page.schedules
            if page.next_after is None:
                return
            after = page.next_after

    def change(self, name: str, **change: Unpack[calls.ScheduleChange]) -> records.Schedule:
        """Change what is given; a new timing starts over from now."""
        return self._client._run(calls.change_schedule(name, **change))

    def pause(self, name: str) -> records.Schedule:
        return self.change(name, paused=True)

    def resume(self, name: str) -> records.Schedule:
        """Go on from now (occurrences missed while paused are not made up)."""
        return self.change(name, paused=False)

    def delete(self, name: str) -> records.Schedule:
        """Delete it; the jobs it made already stay ordinary jobs."""
        return self._client._run(calls.delete_schedule(name))


class SyncLimits:
    """``client.limits``: flow rules, what the dispatcher holds back per routing key (or prefix of
    its words) at dispatch. ``namespace``: the rule's (""; the default one); None: an admin's rule
    for every namespace, another key's own namespace."""

    def __init__(self, client: SyncDispatcherClient) -> None:
        self._client = client

    def list(self, *, namespace: str | None = None) -> tuple[records.FlowRule, ...]:
        return self._client._run(calls.limits(namespace=namespace))

    def get(self, key: str, *, namespace: str | None = None) -> records.FlowRule:
        return self._client._run(calls.get_limit(key, namespace=namespace))

    def set(
        self,
        key: str,
        *,
        namespace: str | None = None,
        paused: bool = False,
        paused_until: datetime | None = None,
        note: str | None = None,
        rate_per_s: float | None = None,
        burst: int | None = None,
        max_in_flight: int | None = None,
        in_flight_timeout_s: calls.Duration | None = None,
    ) -> records.FlowRule:
        """Create or replace the key's rule, whole (what is not given is not kept): paused (until
        resumed, or ``paused_until``), metered (``rate_per_s`` in bursts of ``burst``, at most
        ``max_in_flight`` not yet finished, a silent one's slot freed after
        ``in_flight_timeout_s``), or both. The dispatcher fills the defaults; a rule that holds
        nothing back raises ``InvalidFlowRule``."""
        call = calls.put_limit(
            key,
            namespace=namespace,
            paused=paused,
            paused_until=paused_until,
            note=note,
            rate_per_s=rate_per_s,
            burst=burst,
            max_in_flight=max_in_flight,
            in_flight_timeout_s=in_flight_timeout_s,
        )
        return self._client._run(call)

    def pause(
        self,
        key: str,
        *,
        until: datetime | None = None,
        note: str | None = None,
        namespace: str | None = None,
    ) -> records.FlowRule:
        """Hold the key's jobs (scheduled, never published) until resumed, or ``until``; a
        metered rule keeps its meter."""
        call = calls.pause_key(key, until=until, note=note, namespace=namespace)
        return self._client._run(call)

    def resume(self, key: str, *, namespace: str | None = None) -> records.FlowRule:
        """Let the held jobs go, oldest due first: a rule that only pauses is deleted (the rule
        as it was), a metered one unpaused (the rule as it is now, metering).
        ``FlowRuleNotFound`` when the key has no rule."""
        return self._client._run(calls.resume_key(key, namespace=namespace))

    def delete(self, key: str, *, namespace: str | None = None) -> records.FlowRule:
        return self._client._run(calls.delete_limit(key, namespace=namespace))


class SyncBulkActions:
    """``client.bulk``: cancel, requeue or reschedule every job a filter matches, in the
    background. ``dry_run`` first: how many jobs, and the first of them; ``start`` answers the
    action at once, ``get`` its progress. A key acts only on the jobs it could act on one by one
    (a requeue needs an admin's key)."""

    def __init__(self, client: SyncDispatcherClient) -> None:
        self._client = client

    def dry_run(
        self,
        action: calls.BulkActionName,
        *,
        filter: calls.BulkFilter | None = None,
        run_at: datetime | None = None,
        shift: calls.Duration | None = None,
    ) -> records.BulkDryRun:
        call = calls.bulk_dry_run(action, filter=filter, run_at=run_at, shift=shift)
        return self._client._run(call)

    def start(
        self,
        action: calls.BulkActionName,
        *,
        filter: calls.BulkFilter | None = None,
        run_at: datetime | None = None,
        shift: calls.Duration | None = None,
    ) -> records.BulkAction:
        """A reschedule takes ``run_at`` (every job's new time) or ``shift`` (each job's moved)."""
        call = calls.start_bulk_action(action, filter=filter, run_at=run_at, shift=shift)
        return self._client._run(call)

    def get(self, action_id: str) -> records.BulkAction:
        return self._client._run(calls.get_bulk_action(action_id))

    def list(
        self, *, limit: int = 100, before: str | None = None
    ) -> tuple[records.BulkAction, ...]:
        return self._client._run(calls.bulk_actions(limit=limit, before=before))

    def stop(self, action_id: str) -> records.BulkAction:
        """Stop after the batch in flight (``BulkActionConflict`` unless running)."""
        return self._client._run(calls.stop_bulk_action(action_id))

    def resume(self, action_id: str) -> records.BulkAction:
        """Go on from where it stopped: no job is changed twice."""
        return self._client._run(calls.resume_bulk_action(action_id))
