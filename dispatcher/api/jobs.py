"""/v1/jobs: validate -> intake (store, then heap). No SQL, no AMQP here."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from consumers_sdk import validation
from dispatcher import errors, models
from dispatcher.api import auth, schemas
from dispatcher.api.context import ApiContext, Context
from dispatcher.auth import api_keys
from dispatcher.flow.rules import Rule
from dispatcher.intake import service as intake

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# 415 and 429 come from the HTTP edge (api.browsers, api.gate): a write that is not JSON, unknown
# keys tried too fast.
ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.Problem} for code in (400, 401, 403, 404, 409, 413, 415, 422, 429, 503)
}


@contextmanager
def refusals_named(prefix: str) -> Iterator[None]:
    """A refused prerequisite answers 422 naming ``after[i]`` of the job at fault, an idempotency
    key held outside the key's prefixes 409 naming its ``idempotency_key`` (``prefix`` is
    formatted with the job's index in the request)."""
    try:
        yield
    except errors.InvalidPrerequisite as exc:
        field = f"{prefix.format(exc.job_index)}after[{exc.after_index}]"
        raise errors.InvalidField(field, exc.detail) from None
    except errors.IdempotencyKeyTaken as exc:
        raise errors.KeyConflict(
            f"{prefix.format(exc.job_index)}idempotency_key",
            "is held by a job outside this key's routing-key prefixes",
        ) from None


@router.post(
    "",
    response_model=schemas.JobSubmitted,
    status_code=201,
    responses={
        200: {
            "model": schemas.JobSubmitted,
            "description": "the job stored earlier under this idempotency key",
        },
        **ERRORS,
    },
)
async def create_job(body: schemas.JobCreate, context: Context, caller: auth.Producer) -> Response:
    """Schedule one job. 201 once it is committed; 200 with the existing job for a known key."""
    return await submit_one(body, context, caller)


async def submit_one(
    body: schemas.JobCreate, context: ApiContext, caller: api_keys.Principal
) -> Response:
    """``POST /v1/jobs`` once the request is validated: the route's body, and the lean path's
    (``api.lean``), which serves valid requests without FastAPI's routing."""
    auth.check_routing_key(caller, body.routing_key, "routing_key")
    spec = schemas.to_spec(body, context.settings, now=context.now_dt())
    with refusals_named(""):
        [result] = await context.intake.submit(
            [spec], namespace=caller.namespace, routing_scope=caller.routing_key_filter
        )
    return schemas.json_response(
        schemas.job_document(result.job, outcome=result.outcome),
        201 if result.created else 200,
    )


@router.post(
    "/batch",
    response_model=schemas.BatchOut,
    status_code=201,
    responses={
        200: {
            "model": schemas.BatchOut,
            "description": "every job was stored earlier under its key",
        },
        **ERRORS,
    },
    openapi_extra=schemas.BATCH_REQUEST_BODY,
)
async def create_jobs(request: Request, context: Context, caller: auth.Producer) -> Response:
    """Schedule up to ``max_batch`` jobs, all or nothing."""
    body = schemas.batch_from_json(await request.body())
    limit = context.settings.max_batch
    if len(body.jobs) > limit:
        raise errors.InvalidField("jobs", f"at most {limit} jobs per batch")
    repeated = intake.repeated_key([job.idempotency_key for job in body.jobs])
    for index, job in enumerate(body.jobs):  # the first job at fault answers
        auth.check_routing_key(caller, job.routing_key, f"jobs[{index}].routing_key")
        if repeated is not None and repeated[0] == index:
            raise errors.InvalidField(
                f"jobs[{index}].idempotency_key", f"repeats the key of jobs[{repeated[1]}]"
            )
    now = context.now_dt()
    specs: list[models.JobSpec] = []
    for index, job in enumerate(body.jobs):
        await intake.take_turn(index)
        specs.append(
            schemas.to_spec(job, context.settings, now=now, field_prefix=f"jobs[{index}].")
        )
    with refusals_named("jobs[{}]."):
        results = await context.intake.submit(
            specs, namespace=caller.namespace, routing_scope=caller.routing_key_filter
        )
    documents = []
    for index, result in enumerate(results):
        await intake.take_turn(index)
        documents.append(schemas.job_document(result.job, outcome=result.outcome))
    return schemas.json_response(
        {"jobs": documents}, 201 if any(result.created for result in results) else 200
    )


@router.get("/{job_id}", response_model=schemas.JobWithHistory, responses=ERRORS)
async def get_job(job_id: uuid.UUID, context: Context, caller: auth.Producer) -> Response:
    """The job with its whole history: scheduled, dispatched, each attempt, the final state."""
    job = await context.jobs.get(
        job_id, namespace=caller.namespace_filter, routing_keys=caller.routing_key_filter
    )
    history = await context.history.history(job_id, limit=context.settings.max_history_events)
    document = schemas.history_document(
        job,
        history.events,
        ignored_dropped=history.ignored_dropped,
        events_omitted=history.events_omitted,
        held_by=_held_by(context, job),
    )
    prerequisites = await context.jobs.prerequisites(job_id)
    document["after"] = [str(prerequisite) for prerequisite, _ in prerequisites]
    document["pending"] = [str(prerequisite) for prerequisite, done in prerequisites if not done]
    return schemas.json_response(document)


@router.patch("/{job_id}", response_model=schemas.JobOut, responses=ERRORS)
async def reschedule_job(
    job_id: uuid.UUID, body: schemas.JobPatch, context: Context, caller: auth.Producer
) -> Response:
    """Move a job that has not fired yet to a new time (and/or change its payload or priority).
    It fires at the new time only, on whichever node owns it. 409 once it is being dispatched
    (state ``dispatching``: it will be delivered) or done."""
    change = schemas.to_change(body, context.settings, now=context.now_dt())
    job = await context.jobs.reschedule(
        job_id,
        change,
        namespace=caller.namespace_filter,
        routing_keys=caller.routing_key_filter,
    )
    return schemas.json_response(schemas.job_document(job))


@router.post("/{job_id}/requeue", response_model=schemas.JobOut, responses=ERRORS)
async def requeue_job(job_id: uuid.UUID, context: Context, caller: auth.Admin) -> Response:
    """A dead job back to ``scheduled``, due now: published again to its routing key as a fresh
    delivery (attempts start over; the history keeps the earlier ones). 409 unless dead."""
    job = await context.intake.requeue(job_id, namespace=caller.namespace_filter)
    return schemas.json_response(schemas.job_document(job))


@router.delete("/{job_id}", response_model=schemas.JobOut, responses=ERRORS)
async def cancel_job(job_id: uuid.UUID, context: Context, caller: auth.Producer) -> Response:
    """Cancel a scheduled or waiting job: it is never published, and the jobs waiting for it are
    cancelled too. 409 once it is being or was dispatched."""
    job = await context.jobs.cancel(
        job_id, namespace=caller.namespace_filter, routing_keys=caller.routing_key_filter
    )
    context.metrics.count_by_key(context.metrics.jobs_cancelled, [job])
    return schemas.json_response(schemas.job_document(job))


@router.get("", response_model=schemas.JobPage, responses=ERRORS)
async def list_jobs(
    context: Context,
    caller: auth.Producer,
    state: models.JobState | None = None,
    routing_key: Annotated[
        str | None, Query(max_length=255, pattern=schemas.ROUTING_KEY.pattern)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: uuid.UUID | None = None,
    idempotency_key: Annotated[str | None, Query(max_length=255, pattern="^[^\x00]*$")] = None,
    routing_key_prefix: Annotated[
        str | None,
        Query(
            max_length=256,
            description="these words or below (billing or billing.: billing, billing.charge), "
            "not with routing_key",
        ),
    ] = None,
) -> Response:
    """A page of jobs in creation order (scheduled ones in due order); follow ``next_after`` for
    the next one (a page ends early once its payloads pass ``DISPATCHER_MAX_PAGE_BYTES``: follow
    it until null). With ``idempotency_key``, the jobs stored under that key (one per namespace)
    instead."""
    words = _prefix_words(routing_key, routing_key_prefix)
    if idempotency_key is not None:
        found = await context.jobs.by_idempotency_key(
            idempotency_key,
            namespace=caller.namespace_filter,
            routing_keys=caller.routing_key_filter,
        )
        return schemas.json_response({"jobs": _documents(context, found), "next_after": None})
    jobs, more = await context.jobs.page(
        state=state,
        routing_key=routing_key,
        after=after,
        limit=limit,
        namespace=caller.namespace_filter,
        routing_keys=caller.routing_key_filter,
        max_bytes=context.settings.max_page_bytes,
        routing_key_prefix=words,
    )
    next_after = str(jobs[-1].id) if more else None
    return schemas.json_response({"jobs": _documents(context, jobs), "next_after": next_after})


def _prefix_words(routing_key: str | None, prefix: str | None) -> str | None:
    """A ``routing_key_prefix`` as the words it names, its final dot dropped (as a bulk filter's
    and an API key's prefixes are): checked as a routing key, so ``%`` never reaches the store."""
    if prefix is None:
        return None
    if routing_key is not None:  # the one key, or the keys below: asking both is a mistake
        raise errors.InvalidField("routing_key_prefix", "give routing_key or this, not both")
    words, problem = validation.prefix_words(prefix)
    if problem:
        raise errors.InvalidField("routing_key_prefix", problem)
    return words


def _held_by(context: ApiContext, job: models.Job) -> Rule | None:
    """The flow rule holding a scheduled job back now, as this node applies the rules."""
    if job.state is not models.JobState.SCHEDULED:
        return None
    return context.rules().holds(job.routing_key, job.namespace, context.now_dt())


def _documents(context: ApiContext, jobs: Sequence[models.Job]) -> list[dict[str, object]]:
    return [schemas.job_document(job, held_by=_held_by(context, job)) for job in jobs]
