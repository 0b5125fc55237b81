"""Group commit: concurrent single-job submissions share one transaction and one round trip.

Each request waits for its own row to be committed, as before; under load the rows of many
requests travel in one ``unnest`` INSERT, so throughput no longer costs one commit per request.
A request arriving at an idle node is flushed at once (no lingering), so latency stays one
round trip. A flush the database could not take fails every request in it (they answer 503 and
store nothing); one that failed for another reason is retried a request at a time, so a request
whose job breaks the statement fails alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from dispatcher import errors, models

Insert = Callable[[Sequence[models.NewJob]], Awaitable[list[models.Submitted]]]


class GroupCommit:
    def __init__(self, insert: Insert, *, max_batch: int, flushers: int) -> None:
        self._insert = insert
        self._max_batch = max_batch
        self._flushers = flushers
        self._pending: list[tuple[models.NewJob, asyncio.Future[models.Submitted]]] = []
        self._work = asyncio.Event()
        self.flushes = 0  # round trips made, for tests and metrics

    async def submit(self, job: models.NewJob) -> models.Submitted:
        future: asyncio.Future[models.Submitted] = asyncio.get_running_loop().create_future()
        self._pending.append((job, future))
        self._work.set()
        return await future

    async def run(self) -> None:
        """Flush until cancelled; several flushers keep several round trips in flight."""
        async with asyncio.TaskGroup() as group:
            for number in range(self._flushers):
                group.create_task(self._flush_forever(), name=f"group-commit-{number}")

    async def _flush_forever(self) -> None:
        while True:
            await self._work.wait()
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            if not self._pending:
                self._work.clear()
            if not batch:
                continue
            await self._flush(batch)

    async def _flush(
        self, batch: list[tuple[models.NewJob, asyncio.Future[models.Submitted]]]
    ) -> None:
        self.flushes += 1
        try:
            results = await self._insert([job for job, _ in batch])
        except errors.StoreUnavailable as exc:  # the requests answer it (503)
            _fail(batch, exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            # One request's job failed the shared statement: each is stored on its own, so
            # only that request fails and the others are answered as if alone.
            for one in batch:
                await self._flush([one])
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():  # the client may have gone; its job is stored anyway
                future.set_result(result)


def _fail(
    batch: list[tuple[models.NewJob, asyncio.Future[models.Submitted]]], exc: Exception
) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
