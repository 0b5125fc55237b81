"""One dead job, one dead copy: before ``dlq.requeue`` moves a dead copy back, the dispatcher is
asked what became of its job since (``GET /v1/jobs/{id}``), and a copy whose job was requeued
through the API (or the console, or ``dispatcher jobs requeue``) or has finished is dropped
instead of running the job a second time.

A copy is moved back when its job is still dead; when the dispatcher does not know the job (not
one of its jobs, deleted by retention, or in a namespace the API key cannot see); and when the job
is still ``dispatched``: its consumer's ``dead`` event never reached the dispatcher (events off or
lost), so this copy is the job. A requeue counts when it came after the copy died (``x-dead-at``,
the consumer's clock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final
from urllib.parse import quote

import httpx

from consumers_sdk import contract
from consumers_sdk.errors import DlqError

FINISHED: Final = frozenset({"succeeded", "cancelled", "expired"})
LOOKUPS_AT_ONCE: Final = 8
REQUEUED: Final = "requeued"

JobDocument = Mapping[str, Any]


def drop_reason(job: JobDocument | None, *, dead_at: datetime | None) -> str | None:
    """Why a dead copy must not run again (``requeued``, or the job's final state), or None to
    move it back; ``job`` is the API's document of the job with its history (None: unknown)."""
    if job is None:
        return None
    for step in job.get("history") or ():
        if step.get("event") == REQUEUED and (
            dead_at is None or contract.parse_run_at(str(step["at"])) > dead_at
        ):
            return REQUEUED
    state = str(job.get("state"))
    return state if state in FINISHED else None


class JobLookup:
    """Reads jobs from a dispatcher's HTTP API; ``async with`` closes its connections. An admin
    key sees every namespace."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout_s, transport=transport
        )
        self._at_once = asyncio.Semaphore(LOOKUPS_AT_ONCE)

    async def __aenter__(self) -> JobLookup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def job(self, job_id: str) -> JobDocument | None:
        """The job with its history, None when the dispatcher has no such job. DlqError when it
        cannot answer: nothing is moved or dropped on a guess."""
        async with self._at_once:
            try:
                response = await self._http.get(f"/v1/jobs/{quote(job_id, safe='')}")
            except httpx.HTTPError as exc:
                raise DlqError(f"could not ask the dispatcher about job {job_id}: {exc!r}") from exc
        if response.status_code in (404, 422):  # 422: not even a job id
            return None
        if response.status_code != 200:
            raise DlqError(
                f"the dispatcher answered {response.status_code} about job {job_id}: "
                f"{response.text[:200]}"
            )
        document: JobDocument = response.json()
        return document

    async def reasons(
        self, copies: Sequence[tuple[str | None, datetime | None]]
    ) -> list[str | None]:
        """``drop_reason`` of each (job id, dead at) copy, asked a few at a time."""

        async def one(job_id: str | None, dead_at: datetime | None) -> str | None:
            if not job_id:
                return None
            return drop_reason(await self.job(job_id), dead_at=dead_at)

        return list(await asyncio.gather(*(one(job_id, at) for job_id, at in copies)))
