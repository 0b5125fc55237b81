"""SyncDispatcherClient: ``DispatcherClient``'s methods and records for code without an event
loop (Django and Flask views, scripts), on httpx's sync client. The requests, the retry rules and
the errors are the async client's own (``calls``, ``exchange``); a unit test checks that the two
clients offer the same methods with the same parameters.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, ParamSpec, Self, TypeVar, Unpack

import httpx

from consumers_sdk import calls, errors, exchange, records
from consumers_sdk.client import BATCH_LIMIT, DEFAULT_URL, SchedulableJob

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class SyncDispatcherClient:
    """``DispatcherClient`` without asyncio: the same methods, blocking, returning the same
    records; ``list`` returns an iterator. Open one per process (it holds a connection pool) and
    ``close()`` it, or use it in a ``with`` block."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
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
        """As ``DispatcherClient.schedule``: the same options (``on_existing=``,
        ``release_key=`` among them) and ``outcome``."""
        return self._run(calls.schedule(routing_key, payload, **options))

    def schedule_many(
        self, jobs: Sequence[Mapping[str, Any]], *, chunk_size: int = BATCH_LIMIT
    ) -> builtins.list[records.JobRecord]:
        """As ``DispatcherClient.schedule_many``: chunks all or nothing, ``stored`` on the error."""
        stored: builtins.list[records.JobRecord] = []
        for offset, chunk in exchange.chunks(jobs, chunk_size):
            try:
                batch = self._run(calls.schedule_batch(chunk))
            except errors.ClientError as refused:
                raise exchange.partly_stored(refused, stored, offset) from None
            stored.extend(batch)
        return stored

    def get(self, job_id: str) -> records.JobRecord:
        return self._run(calls.get(job_id))

    def list_page(
        self, *, after: str | None = None, limit: int = 100, **filters: Unpack[calls.JobFilters]
    ) -> records.JobPage:
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
        return self._run(calls.reschedule(job_id, **change))

    def cancel(self, job_id: str) -> records.JobRecord:
        return self._run(calls.cancel(job_id))

    def requeue(self, job_id: str) -> records.JobRecord:
        return self._run(calls.requeue(job_id))

    def job(
        self, routing_key: str, **defaults: Unpack[calls.JobOptions]
    ) -> Callable[[Callable[P, R]], SchedulableJob[P, R, records.JobRecord]]:
        """Decorate a function so that ``fn.schedule(payload, delay=...)`` schedules it."""

        def wrap(function: Callable[P, R]) -> SchedulableJob[P, R, records.JobRecord]:
            return SchedulableJob(self, routing_key, function, defaults)

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
    """``client.schedules`` of the sync client: as ``Schedules``, blocking."""

    def __init__(self, client: SyncDispatcherClient) -> None:
        self._client = client

    def create(
        self, name: str, routing_key: str, payload: Any, **options: Unpack[calls.ScheduleOptions]
    ) -> records.Schedule:
        call = calls.create_schedule(name, routing_key, payload, **options)
        return self._client._run(call)

    def get(self, name: str) -> records.Schedule:
        return self._client._run(calls.get_schedule(name))

    def list_page(self, *, after: int = 0, limit: int = 100) -> records.SchedulePage:
        return self._client._run(calls.schedule_page(after=after, limit=limit))

    def list(self, *, page_size: int = 100) -> Iterator[records.Schedule]:
        after = 0
        while True:
            page = self.list_page(after=after, limit=page_size)
            yield from page.schedules
            if page.next_after is None:
                return
            after = page.next_after

    def change(self, name: str, **change: Unpack[calls.ScheduleChange]) -> records.Schedule:
        return self._client._run(calls.change_schedule(name, **change))

    def pause(self, name: str) -> records.Schedule:
        return self.change(name, paused=True)

    def resume(self, name: str) -> records.Schedule:
        return self.change(name, paused=False)

    def delete(self, name: str) -> records.Schedule:
        return self._client._run(calls.delete_schedule(name))


class SyncLimits:
    """``client.limits`` of the sync client: as ``Limits``, blocking."""

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
        call = calls.pause_key(key, until=until, note=note, namespace=namespace)
        return self._client._run(call)

    def resume(self, key: str, *, namespace: str | None = None) -> records.FlowRule:
        return self._client._run(calls.resume_key(key, namespace=namespace))

    def delete(self, key: str, *, namespace: str | None = None) -> records.FlowRule:
        return self._client._run(calls.delete_limit(key, namespace=namespace))


class SyncBulkActions:
    """``client.bulk`` of the sync client: as ``BulkActions``, blocking."""

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
        return self._client._run(
            calls.bulk_dry_run(action, filter=filter, run_at=run_at, shift=shift)
        )

    def start(
        self,
        action: calls.BulkActionName,
        *,
        filter: calls.BulkFilter | None = None,
        run_at: datetime | None = None,
        shift: calls.Duration | None = None,
    ) -> records.BulkAction:
        return self._client._run(
            calls.start_bulk_action(action, filter=filter, run_at=run_at, shift=shift)
        )

    def get(self, action_id: str) -> records.BulkAction:
        return self._client._run(calls.get_bulk_action(action_id))

    def list(
        self, *, limit: int = 100, before: str | None = None
    ) -> tuple[records.BulkAction, ...]:
        return self._client._run(calls.bulk_actions(limit=limit, before=before))

    def stop(self, action_id: str) -> records.BulkAction:
        return self._client._run(calls.stop_bulk_action(action_id))

    def resume(self, action_id: str) -> records.BulkAction:
        return self._client._run(calls.resume_bulk_action(action_id))
