"""DispatcherClient: schedule, get and cancel jobs over the dispatcher's HTTP API.

4xx answers raise typed errors at once. 503 (the dispatcher stored nothing) and failures to
connect are retried with backoff; a request lost after it was sent is retried only when replaying
it is harmless: a GET, or a POST whose every job carries an ``idempotency_key``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, TypedDict, TypeVar, Unpack

import httpx

from consumers_sdk import contract, errors, tracing

P = ParamSpec("P")
R = TypeVar("R")
JobView = dict[str, Any]
# The request never reached the dispatcher: always safe to send again.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class JobOptions(TypedDict, total=False):
    delay: timedelta  # or run_at, not both; neither means now
    run_at: datetime  # timezone-aware
    idempotency_key: str
    headers: Mapping[str, contract.HeaderValue]
    priority: int  # 0-9
    ttl: timedelta
    max_attempts: int  # this job's own retry policy, over the consumer's defaults
    retry_backoff: Sequence[timedelta | float]  # after each failed attempt, the last repeated


def _seconds(value: timedelta | float) -> float:
    """A duration given as a ``timedelta`` or as seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def job_body(routing_key: str, payload: Any, **options: Unpack[JobOptions]) -> dict[str, Any]:
    """The JSON of one job, as ``POST /v1/jobs`` (and each item of ``schedule_many``) takes it."""
    delay, run_at, ttl = options.get("delay"), options.get("run_at"), options.get("ttl")
    if delay is not None and run_at is not None:
        raise ValueError("give delay or run_at, not both")
    body: dict[str, Any] = {"routing_key": routing_key, "payload": payload}
    if delay is not None:
        body["delay_ms"] = max(0, round(delay.total_seconds() * 1000))
    if run_at is not None:
        if run_at.tzinfo is None:
            raise ValueError("run_at must be timezone-aware")
        body["run_at"] = run_at.isoformat()
    headers = tracing.inject(options.get("headers"))  # the current span, when OpenTelemetry is on
    optional = {
        "idempotency_key": options.get("idempotency_key"),
        "headers": dict(headers) if headers else None,
        "priority": options.get("priority"),
        "ttl_ms": round(ttl.total_seconds() * 1000) if ttl is not None else None,
        "max_attempts": options.get("max_attempts"),
    }
    backoff = options.get("retry_backoff")
    if backoff is not None:
        body["retry_backoff_s"] = [_seconds(step) for step in backoff]
    body.update({key: value for key, value in optional.items() if value is not None})
    return body


class DispatcherClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        retries: int = 5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        # The key travels in a header only; it is never part of an error or a repr. Every write is
        # JSON, the body-less ones too: the node refuses writes a browser form could make.
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout_s, transport=transport
        )
        self._retries = retries

    async def __aenter__(self) -> DispatcherClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def schedule(
        self, routing_key: str, payload: Any, **options: Unpack[JobOptions]
    ) -> JobView:
        """Schedule one job: ``delay=`` or ``run_at=``, ``idempotency_key=``, ``headers=``,
        ``priority=``, ``ttl=``, ``max_attempts=``, ``retry_backoff=``. 201 and 200 (its
        idempotency key was seen) both return the job."""
        body = job_body(routing_key, payload, **options)
        result: JobView = await self._request(
            "POST", "/v1/jobs", json=body, replay_safe="idempotency_key" in body
        )
        return result

    async def schedule_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[JobView]:
        """Schedule a batch all or nothing; each item is a ``job_body(...)``."""
        replay_safe = all(job.get("idempotency_key") for job in jobs)
        result = await self._request(
            "POST", "/v1/jobs/batch", json={"jobs": list(jobs)}, replay_safe=replay_safe
        )
        batch: list[JobView] = result["jobs"]
        return batch

    async def get(self, job_id: str) -> JobView:
        result: JobView = await self._request("GET", f"/v1/jobs/{job_id}", replay_safe=True)
        return result

    async def cancel(self, job_id: str) -> JobView:
        """Cancel a scheduled job; ``JobConflict`` (with ``.state``) when it is past that."""
        # Not replayed after a lost answer: the replay would report the job as already cancelled.
        result: JobView = await self._request("DELETE", f"/v1/jobs/{job_id}", replay_safe=False)
        return result

    def job(
        self, routing_key: str, **defaults: Unpack[JobOptions]
    ) -> Callable[[Callable[P, R]], SchedulableJob[P, R]]:
        """Decorate a function so that ``await fn.schedule(payload, delay=...)`` schedules it."""

        def wrap(function: Callable[P, R]) -> SchedulableJob[P, R]:
            return SchedulableJob(self, routing_key, function, defaults)

        return wrap

    async def _request(self, method: str, path: str, *, replay_safe: bool, json: Any = None) -> Any:
        delay = 0.2
        for attempt in range(self._retries + 1):
            try:
                response = await self._http.request(method, path, json=json)
            except httpx.TransportError as exc:
                if attempt == self._retries or not (replay_safe or isinstance(exc, _NOT_SENT)):
                    raise errors.DispatcherUnavailable(0, f"no answer: {exc!r}") from exc
            else:
                if response.status_code < 400:
                    return response.json()
                if response.status_code != 503 or attempt == self._retries:
                    raise _error(response)
            await asyncio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")


def _error(response: httpx.Response) -> errors.ClientError:
    try:
        body = response.json()
    except ValueError:
        body = {"message": response.text}
    message = str(body.get("message", response.reason_phrase))
    status = response.status_code
    kind: type[errors.ClientError] = errors.ClientError
    if status in (401, 403):
        kind = errors.AccessDenied
    elif status in (400, 413, 422):
        kind = errors.InvalidJob
    elif status == 404:
        kind = errors.JobNotFound
    elif status == 409:
        kind = errors.JobConflict
    elif status == 503:
        kind = errors.DispatcherUnavailable
    return kind(status, message, body)


class SchedulableJob(Generic[P, R]):
    """A function that can still be called directly, and scheduled to run later elsewhere."""

    def __init__(
        self,
        client: DispatcherClient,
        routing_key: str,
        function: Callable[P, R],
        defaults: JobOptions,
    ) -> None:
        self._client = client
        self.routing_key = routing_key
        self._function = function
        self._defaults = defaults

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._function(*args, **kwargs)

    def schedule(self, payload: Any, **options: Unpack[JobOptions]) -> Awaitable[JobView]:
        """Schedule this function's job; ``options`` override the decorator's defaults."""
        merged: JobOptions = {**self._defaults, **options}
        return self._client.schedule(self.routing_key, payload, **merged)
