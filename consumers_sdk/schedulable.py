"""The ``job()`` decorator's result, for both clients: a function that can still be called
directly, and scheduled to run later elsewhere through the client that made it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, Unpack

from consumers_sdk import calls

P = ParamSpec("P")
R = TypeVar("R")
S_co = TypeVar("S_co", covariant=True)


class Scheduler(Protocol[S_co]):
    """A client's ``schedule``: awaitable from ``DispatcherClient``, a record from the sync one."""

    def schedule(
        self, routing_key: str, payload: Any, **options: Unpack[calls.JobOptions]
    ) -> S_co: ...


class SchedulableJob(Generic[P, R, S_co]):
    """A function that can still be called directly, and scheduled to run later elsewhere."""

    def __init__(
        self,
        client: Scheduler[S_co],
        routing_key: str,
        function: Callable[P, R],
        defaults: calls.JobOptions,
    ) -> None:
        self._client = client
        self.routing_key = routing_key
        self._function = function
        self._defaults = defaults

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._function(*args, **kwargs)

    def schedule(self, payload: Any, **options: Unpack[calls.JobOptions]) -> S_co:
        """Schedule this function's job; ``options`` override the decorator's defaults."""
        merged: calls.JobOptions = {**self._defaults, **options}
        return self._client.schedule(self.routing_key, payload, **merged)
