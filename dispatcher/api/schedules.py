"""/v1/schedules: recurring schedules whose occurrences become ordinary jobs. Validate -> store;
the materialiser (``materialiser``) makes the jobs. No SQL, no AMQP here."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response

from consumers_sdk import schedule_rules
from dispatcher.api import auth, schedule_schemas, schemas
from dispatcher.api.context import Context
from dispatcher.api.jobs import ERRORS
from dispatcher.recurring import changes, model
from dispatcher.recurring.occurrences import Timing

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
NameParam = Annotated[str, schedule_schemas.Name]


@router.post("", response_model=schedule_schemas.ScheduleOut, status_code=201, responses=ERRORS)
async def create_schedule(
    body: schedule_schemas.ScheduleCreate, context: Context, caller: auth.Producer
) -> Response:
    """Create a schedule in the caller's namespace; 409 when the name is taken there."""
    auth.check_routing_key(caller, body.job.routing_key, "job.routing_key")
    now = context.now_dt()
    start_at = schedule_schemas.in_utc(body.start_at, "start_at") or now
    end_at = schedule_schemas.in_utc(body.end_at, "end_at")
    changes.check_timing(
        body.cron,
        body.interval_s,
        start_at,
        end_at,
        min_interval_s=context.settings.schedule_min_interval_s,
    )
    timing = Timing(
        cron=body.cron,
        timezone=body.timezone,
        interval_s=body.interval_s,
        start_at=start_at,
        end_at=end_at,
    )
    spec = model.ScheduleSpec(
        name=body.name,
        timing=timing,
        template=schedule_schemas.to_template(body.job, context.settings, now=now),
        missed=body.missed,
        grace_s=body.grace_s,
        paused=body.paused,
    )
    schedule = await context.schedules.create(
        spec,
        namespace=caller.namespace,
        next_at=timing.first(),
        limit=context.settings.max_schedules_per_namespace,
        jobs_per_minute=context.settings.max_schedule_jobs_per_minute,
    )
    return schemas.json_response(schedule_schemas.schedule_document(schedule), 201)


@router.get("", response_model=schedule_schemas.SchedulePage, responses=ERRORS)
async def list_schedules(
    context: Context,
    caller: auth.Producer,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[int, Query(ge=0, le=schemas.INT64_MAX)] = 0,
) -> Response:
    """The caller's schedules (an admin's: every namespace's) in creation order."""
    found, more = await context.schedules.page(
        namespace=caller.namespace_filter,
        after=after,
        limit=limit,
        routing_keys=caller.routing_key_filter,
        max_bytes=context.settings.max_page_bytes,
    )
    return schemas.json_response(
        {
            "schedules": [schedule_schemas.schedule_document(schedule) for schedule in found],
            "next_after": found[-1].id if more else None,
        }
    )


@router.get("/{name}", response_model=schedule_schemas.ScheduleOut, responses=ERRORS)
async def get_schedule(name: NameParam, context: Context, caller: auth.Producer) -> Response:
    """The schedule with its next occurrences (none while paused or once ended)."""
    schedule = await context.schedules.get(
        name, namespace=caller.namespace, routing_keys=caller.routing_key_filter
    )
    upcoming: list[datetime] = []
    if not schedule.spec.paused and schedule.next_at is not None:
        try:
            upcoming = schedule.spec.timing.upcoming(context.now_dt(), schedule_rules.UPCOMING)
        except Exception:  # unplannable (its zone left the tz database): the materialiser parks it
            logger.exception("schedule %s: no upcoming occurrences", name)
    return schemas.json_response(schedule_schemas.schedule_document(schedule, upcoming=upcoming))


@router.patch("/{name}", response_model=schedule_schemas.ScheduleOut, responses=ERRORS)
async def update_schedule(
    name: NameParam, body: schedule_schemas.ScheduleUpdate, context: Context, caller: auth.Producer
) -> Response:
    """Pause, resume, or change the timing, the job, the end or the missed policy."""
    now = context.now_dt()
    template = None
    if body.job is not None:
        auth.check_routing_key(caller, body.job.routing_key, "job.routing_key")
        template = schedule_schemas.to_template(body.job, context.settings, now=now)
    asked = changes.ScheduleChange(
        given=body.model_fields_set,
        paused=body.paused,
        cron=body.cron,
        timezone=body.timezone,
        interval_s=body.interval_s,
        template=template,
        end_at=schedule_schemas.in_utc(body.end_at, "end_at"),
        missed=body.missed,
        grace_s=body.grace_s,
    )
    min_interval_s = context.settings.schedule_min_interval_s

    def change(current: model.Schedule) -> tuple[model.ScheduleSpec, datetime | None]:
        return changes.merged(current, asked, now=now, min_interval_s=min_interval_s)

    schedule = await context.schedules.update(
        name,
        namespace=caller.namespace,
        change=change,
        routing_keys=caller.routing_key_filter,
        jobs_per_minute=context.settings.max_schedule_jobs_per_minute,
    )
    return schemas.json_response(schedule_schemas.schedule_document(schedule))


@router.delete("/{name}", response_model=schedule_schemas.ScheduleOut, responses=ERRORS)
async def delete_schedule(name: NameParam, context: Context, caller: auth.Producer) -> Response:
    """Delete the schedule; jobs it already made (due within the materialiser's look-ahead)
    stay ordinary jobs (find them by idempotency key, cancel them if need be)."""
    schedule = await context.schedules.delete(
        name, namespace=caller.namespace, routing_keys=caller.routing_key_filter
    )
    return schemas.json_response(schedule_schemas.schedule_document(schedule))
