"""Recording fake clients for users' tests: ``DispatcherClient``'s and ``SyncDispatcherClient``'s
own methods, signatures and records, answered in memory by a ``MemoryAPI`` instead of a node.

They are the real clients with only the sending replaced: every method builds its request and
parses its answer with the real client's code, so the fakes cannot drift from the clients. What
was done is kept in order for a test to assert on (``scheduled``, ``cancelled``, ...).

    client = RecordingClient()
    await place_order(client, order_id=7)          # code under test calls client.schedule(...)
    [job] = client.scheduled
    assert (job.routing_key, job.idempotency_key) == ("orders.expire", "order-7-expiry")
"""

from __future__ import annotations

from typing import TypeVar

from consumers_sdk import calls, client, exchange, sync_client
from consumers_sdk.testing import memory_api

T = TypeVar("T")
NOWHERE = "http://dispatcher.invalid"  # never reached: nothing is sent


class RecordingClient(client.DispatcherClient, memory_api.MemoryAPI):
    """A ``DispatcherClient`` whose dispatcher lives in memory. ``max_batch`` is the node's
    ``DISPATCHER_MAX_BATCH``; ``clock`` (returning an aware ``datetime``) dates the jobs."""

    def __init__(
        self, *, max_batch: int = exchange.BATCH_LIMIT, clock: memory_api.Clock | None = None
    ) -> None:
        client.DispatcherClient.__init__(self, NOWHERE, retries=0)
        memory_api.MemoryAPI.__init__(self, max_batch=max_batch, clock=clock)

    async def _run(self, call: calls.Call[T]) -> T:
        return self.answer(call)


class RecordingSyncClient(sync_client.SyncDispatcherClient, memory_api.MemoryAPI):
    """A ``SyncDispatcherClient`` whose dispatcher lives in memory (as ``RecordingClient``)."""

    def __init__(
        self, *, max_batch: int = exchange.BATCH_LIMIT, clock: memory_api.Clock | None = None
    ) -> None:
        sync_client.SyncDispatcherClient.__init__(self, NOWHERE, retries=0)
        memory_api.MemoryAPI.__init__(self, max_batch=max_batch, clock=clock)

    def _run(self, call: calls.Call[T]) -> T:
        return self.answer(call)
