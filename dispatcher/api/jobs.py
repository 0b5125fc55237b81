"""/v1/jobs: validate -> intake (store, then heap). No SQL, no AMQP here."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from dispatcher import errors, models
from dispatcher.api import schemas

if TYPE_CHECKING:
    from dispatcher.node import Node

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.Problem} for code in (400, 404, 409, 413, 422, 503)
}


async def get_node(request: Request) -> Node:
    # async on purpose: FastAPI runs a sync dependency in its thread pool on every request.
    node: Node = request.app.state.node
    return node


NodeDep = Annotated["Node", Depends(get_node)]


@router.post("", response_model=schemas.JobSubmitted, status_code=201, responses=ERRORS)
async def create_job(
    body: schemas.JobCreate, node: NodeDep, response: Response
) -> schemas.JobSubmitted:
    """Schedule one job. 201 once it is committed; 200 with the existing job for a known key."""
    spec = schemas.to_spec(body, node.settings, now=datetime.now(UTC))
    [result] = await node.intake.submit([spec])
    if not result.created:
        response.status_code = 200
    return schemas.JobSubmitted(
        **schemas.JobOut.of(result.job).model_dump(), created=result.created
    )


@router.post("/batch", response_model=schemas.BatchOut, status_code=201, responses=ERRORS)
async def create_jobs(
    body: schemas.JobBatchCreate, node: NodeDep, response: Response
) -> schemas.BatchOut:
    """Schedule up to ``max_batch`` jobs, all or nothing."""
    limit = node.settings.max_batch
    if len(body.jobs) > limit:
        raise errors.InvalidField("jobs", f"at most {limit} jobs per batch")
    keys: dict[str, int] = {}
    for index, job in enumerate(body.jobs):
        if job.idempotency_key is None:
            continue
        if job.idempotency_key in keys:
            raise errors.InvalidField(
                f"jobs[{index}].idempotency_key",
                f"repeats the key of jobs[{keys[job.idempotency_key]}]",
            )
        keys[job.idempotency_key] = index
    now = datetime.now(UTC)
    specs = [
        schemas.to_spec(job, node.settings, now=now, field_prefix=f"jobs[{index}].")
        for index, job in enumerate(body.jobs)
    ]
    results = await node.intake.submit(specs)
    if not any(result.created for result in results):
        response.status_code = 200
    return schemas.BatchOut(
        jobs=[
            schemas.JobSubmitted(**schemas.JobOut.of(r.job).model_dump(), created=r.created)
            for r in results
        ]
    )


@router.get("/{job_id}", response_model=schemas.JobOut, responses=ERRORS)
async def get_job(job_id: uuid.UUID, node: NodeDep) -> schemas.JobOut:
    return schemas.JobOut.of(await node.store.get(job_id))


@router.delete("/{job_id}", response_model=schemas.JobOut, responses=ERRORS)
async def cancel_job(job_id: uuid.UUID, node: NodeDep) -> schemas.JobOut:
    """Cancel a scheduled job: it is never published. 409 once it is being or was dispatched."""
    job = await node.store.cancel(job_id)
    node.metrics.jobs_cancelled.inc()
    return schemas.JobOut.of(job)


@router.get("", response_model=schemas.JobPage, responses=ERRORS)
async def list_jobs(
    node: NodeDep,
    state: models.JobState | None = None,
    routing_key: Annotated[
        str | None, Query(max_length=255, pattern=schemas.ROUTING_KEY.pattern)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: uuid.UUID | None = None,
) -> schemas.JobPage | JSONResponse:
    """A page of jobs in creation order; follow ``next_after`` for the next one."""
    jobs = await node.store.page(state=state, routing_key=routing_key, after=after, limit=limit)
    next_after = jobs[-1].id if len(jobs) == limit else None
    return schemas.JobPage(jobs=[schemas.JobOut.of(job) for job in jobs], next_after=next_after)
