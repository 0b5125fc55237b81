"""/v1/schedules: recurring schedules whose occurrences become ordinary jobs. Validate -> store;
the materialiser (``materialiser``) makes the jobs. No SQL, no AMQP here."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response

from dispatcher import errors
from dispatcher.api import auth, schemas
from dispatcher.api import schedule_schemas as io
from dispatcher.api.deps import Deps
from dispatcher.api.jobs import ERRORS
from dispatcher.recurring import model
from dispatcher.recurring.occurrences import Timing

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
NameParam = Annotated[str, io.Name]


@router.post("", response_model=io.ScheduleOut, status_code=201, responses=ERRORS)
async def create_schedule(body: io.ScheduleCreate, deps: Deps, caller: auth.Producer) -> Response:
    """Create a schedule in the caller's namespace; 409 when the name is taken there."""
    auth.check_routing_key(caller, body.job.routing_key, "job.routing_key")
    now = deps.now()
    start_at = io.in_utc(body.start_at, "start_at") or now
    end_at = io.in_utc(body.end_at, "end_at")
    io.check_timing(
        body.cron,
        body.interval_s,
        start_at,
        end_at,
        min_interval_s=deps.settings.schedule_min_interval_s,
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
        template=io.to_template(body.job, deps.settings, now=now),
        missed=body.missed,
        grace_s=body.grace_s,
        paused=body.paused,
    )
    schedule = await deps.schedules.create(
        spec,
        namespace=caller.namespace,
        next_at=timing.first(),
        limit=deps.settings.max_schedules_per_namespace,
        jobs_per_minute=deps.settings.max_schedule_jobs_per_minute,
    )
    return schemas.json_response(io.schedule_document(schedule), 201)


@router.get("", response_model=io.SchedulePage, responses=ERRORS)
async def list_schedules(
    deps: Deps,
    caller: auth.Producer,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[int, Query(ge=0, le=schemas.INT64_MAX)] = 0,
) -> Response:
    """The caller's schedules (an admin's: every namespace's) in creation order."""
    found, more = await deps.schedules.page(
        namespace=caller.namespace_filter,
        after=after,
        limit=limit,
        routing_keys=caller.routing_key_filter,
        max_bytes=deps.settings.max_page_bytes,
    )
    return schemas.json_response(
        {
            "schedules": [io.schedule_document(schedule) for schedule in found],
            "next_after": found[-1].id if more else None,
        }
    )


@router.get("/{name}", response_model=io.ScheduleOut, responses=ERRORS)
async def get_schedule(name: NameParam, deps: Deps, caller: auth.Producer) -> Response:
    """The schedule with its next occurrences (none while paused or once ended)."""
    schedule = await deps.schedules.get(
        name, namespace=caller.namespace, routing_keys=caller.routing_key_filter
    )
    upcoming: list[datetime] = []
    if not schedule.spec.paused and schedule.next_at is not None:
        try:
            upcoming = schedule.spec.timing.upcoming(deps.now(), io.UPCOMING)
        except Exception:  # unplannable (its zone left the tz database): the materialiser parks it
            logger.exception("schedule %s: no upcoming occurrences", name)
    return schemas.json_response(io.schedule_document(schedule, upcoming=upcoming))


@router.patch("/{name}", response_model=io.ScheduleOut, responses=ERRORS)
async def update_schedule(
    name: NameParam, body: io.ScheduleUpdate, deps: Deps, caller: auth.Producer
) -> Response:
    """Pause, resume, or change the timing, the job, the end or the missed policy."""
    given = body.model_fields_set
    now = deps.now()
    template = None
    if body.job is not None:
        auth.check_routing_key(caller, body.job.routing_key, "job.routing_key")
        template = io.to_template(body.job, deps.settings, now=now)
    end_at = io.in_utc(body.end_at, "end_at")

    # Only an interval given now must respect today's floor: one stored before it was raised
    # may still be paused, resumed or given a new job.
    floor = deps.settings.schedule_min_interval_s if "interval_s" in given else 1

    def change(current: model.Schedule) -> tuple[model.ScheduleSpec, datetime | None]:
        return _changed(
            current, body, given, template=template, end_at=end_at, now=now, min_interval_s=floor
        )

    schedule = await deps.schedules.update(
        name,
        namespace=caller.namespace,
        change=change,
        routing_keys=caller.routing_key_filter,
        jobs_per_minute=deps.settings.max_schedule_jobs_per_minute,
    )
    return schemas.json_response(io.schedule_document(schedule))


def _changed(
    current: model.Schedule,
    body: io.ScheduleUpdate,
    given: set[str],
    *,
    template: model.Template | None,
    end_at: datetime | None,
    now: datetime,
    min_interval_s: int,
) -> tuple[model.ScheduleSpec, datetime | None]:
    """The merged definition and where the schedule goes on. A new timing, or a resume, starts
    over from now (occurrences already made jobs keep their jobs: same keys, no duplicates);
    other changes keep ``next_at``."""
    old = current.spec
    timing = old.timing
    cron_expression = body.cron if "cron" in given else timing.cron
    interval_s = body.interval_s if "interval_s" in given else timing.interval_s
    if "cron" in given and body.cron is not None and "interval_s" not in given:
        interval_s = None  # switching to cron
    if "interval_s" in given and body.interval_s is not None and "cron" not in given:
        cron_expression = None  # switching to an interval
    new_end = end_at if "end_at" in given else timing.end_at
    io.check_timing(
        cron_expression, interval_s, timing.start_at, new_end, min_interval_s=min_interval_s
    )
    new_timing = Timing(
        cron=cron_expression,
        timezone=body.timezone or timing.timezone,
        interval_s=interval_s,
        start_at=timing.start_at,
        end_at=new_end,
    )
    paused = old.paused if body.paused is None else body.paused
    spec = model.ScheduleSpec(
        name=old.name,
        timing=new_timing,
        template=template or old.template,
        missed=body.missed or old.missed,
        grace_s=old.grace_s if body.grace_s is None else body.grace_s,
        paused=paused,
    )
    next_at = current.next_at
    if new_timing != timing or (old.paused and not paused):
        try:
            next_at = new_timing.at_or_after(max(now, timing.start_at))
        except (KeyError, ValueError):  # a zone stored earlier, gone from the tz database
            raise errors.InvalidField("timezone", "not in this node's tz database") from None
    return spec, next_at


@router.delete("/{name}", response_model=io.ScheduleOut, responses=ERRORS)
async def delete_schedule(name: NameParam, deps: Deps, caller: auth.Producer) -> Response:
    """Delete the schedule; jobs it already made (due within the materialiser's look-ahead)
    stay ordinary jobs (find them by idempotency key, cancel them if need be)."""
    schedule = await deps.schedules.delete(
        name, namespace=caller.namespace, routing_keys=caller.routing_key_filter
    )
    return schemas.json_response(io.schedule_document(schedule))
