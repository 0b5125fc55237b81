"""/v1/bulk-actions: cancel, requeue or reschedule every job a filter matches (``bulk``).
Validate -> a dry run (count and sample) or a stored action that the nodes' runners work in the
background (``bulk_runner``). No SQL, no AMQP here.

A key acts only on the jobs it could act on one by one, and sees, stops and resumes only the
actions whose jobs it could act on (``queries.bulk_actions.bulk_visible``): its namespace and
routing-key prefixes are stored with the action (cancel and reschedule need a producer's key, a
requeue an admin's, as ``DELETE``, ``PATCH`` and ``POST .../requeue`` of /v1/jobs do)."""

from __future__ import annotations

import logging
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from consumers_sdk import bulk_rules, validation
from dispatcher import errors
from dispatcher.api import auth, bulk_schemas, schemas
from dispatcher.api.context import ApiContext, Context
from dispatcher.api.jobs import ERRORS
from dispatcher.auth import api_keys
from dispatcher.bulk import model as bulk

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/bulk-actions", tags=["bulk actions"])


def _namespace(caller: api_keys.Principal, asked: str | None) -> str | None:
    """The namespace an action works in: the key's own; an admin's may name one (else every)."""
    if caller.scope is not api_keys.Scope.ADMIN:
        own = caller.namespace or ""
        if asked is not None and asked != own:
            raise errors.Forbidden(
                f"this key acts on namespace {own!r} only", field="filter.namespace"
            )
        return own
    if asked and (problem := validation.namespace_problem(asked)):
        raise errors.InvalidField("filter.namespace", problem)
    return asked


def _plan(
    body: bulk_schemas.BulkActionIn, context: ApiContext, caller: api_keys.Principal
) -> tuple[bulk.Action, bulk.Filter, bulk.Change]:
    """The action, filter and change a request asks for, or 403/422 naming the field."""
    action = bulk.Action(body.action)
    if action is bulk.Action.REQUEUE and not caller.has(api_keys.Scope.ADMIN):
        raise errors.Forbidden(auth.denied(caller, api_keys.Scope.ADMIN), field="action")
    asked = body.filter
    if asked.routing_key is not None:
        auth.check_routing_key(caller, asked.routing_key, "filter.routing_key")
    scope = caller.routing_key_filter
    spec = bulk.check_filter(
        action,
        namespace=_namespace(caller, asked.namespace),
        scope_prefixes=tuple(scope) if scope is not None else None,
        state=asked.state,
        routing_key=asked.routing_key,
        routing_key_prefix=asked.routing_key_prefix,
        run_at_from=asked.run_at_from,
        run_at_to=asked.run_at_to,
        finished_from=asked.finished_from,
        finished_to=asked.finished_to,
        error_contains=asked.error_contains,
    )
    change = bulk.check_change(
        action,
        run_at=body.run_at,
        shift_s=body.shift_s,
        now=context.now_dt(),
        max_delay_days=context.settings.max_delay_days,
    )
    return action, spec, change


@router.post(
    "",
    response_model=bulk_schemas.BulkActionOut,
    status_code=202,
    responses={200: {"model": bulk_schemas.DryRunOut, "description": "a dry run"}, **ERRORS},
)
async def create_bulk_action(
    body: bulk_schemas.BulkActionIn, context: Context, caller: auth.Producer
) -> Response:
    """Start a bulk action (202, the action: follow its progress with GET), or with ``dry_run``
    answer how many jobs it would change now (counted up to ``DISPATCHER_BULK_COUNT_CAP``:
    ``matched_at_least`` says the count stopped there) and the first of them (200, nothing
    changed). 429 with Retry-After while the node counts as many as it does at once; 409 past
    the namespace's budget of actions."""
    action, spec, change = _plan(body, context, caller)
    shown = bulk_rules.SAMPLE_SIZE if body.dry_run else 0
    count, sample = await context.bulk_actions.dry_run(spec, sample=shown)
    if body.dry_run:
        return schemas.json_response(
            {
                "action": action.value,
                "matched": count.matched,
                "matched_at_least": count.at_least,
                "sample": [schemas.job_document(job) for job in sample],
            }
        )
    stored = await context.bulk_actions.create(
        action,
        spec,
        change,
        created_by=caller.key,
        by_operator=caller.scope is api_keys.Scope.ADMIN,
        matched_estimate=count.matched,
    )
    logger.info(
        "bulk action %s (%s) made by %s: %s%d jobs match",
        stored.id,
        action.value,
        caller.key,
        "at least " if count.at_least else "",
        count.matched,
        extra={"action": "bulk", "bulk_action": str(stored.id)},
    )
    context.bulk_started()
    return schemas.json_response(bulk_schemas.action_document(stored), 202)


@router.get("", response_model=bulk_schemas.BulkActionPage, responses=ERRORS)
async def list_bulk_actions(
    context: Context,
    caller: auth.Producer,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: uuid.UUID | None = None,
) -> Response:
    """The actions this key may see, by id descending; follow ``next_before``."""
    found = await context.bulk_actions.page(
        namespace=caller.namespace_filter,
        routing_keys=caller.routing_key_filter,
        limit=limit,
        before=before,
    )
    next_before = str(found[-1].id) if len(found) == limit else None
    return schemas.json_response(
        {
            "bulk_actions": [bulk_schemas.action_document(action) for action in found],
            "next_before": next_before,
        }
    )


@router.get("/{action_id}", response_model=bulk_schemas.BulkActionOut, responses=ERRORS)
async def get_bulk_action(
    action_id: uuid.UUID, context: Context, caller: auth.Producer
) -> Response:
    """An action and its progress."""
    found = await context.bulk_actions.get(
        action_id, namespace=caller.namespace_filter, routing_keys=caller.routing_key_filter
    )
    return schemas.json_response(bulk_schemas.action_document(found))


@router.post("/{action_id}/stop", response_model=bulk_schemas.BulkActionOut, responses=ERRORS)
async def stop_bulk_action(
    action_id: uuid.UUID, context: Context, caller: auth.Producer
) -> Response:
    """Stop a running action after the batch in flight (409 unless running)."""
    await _may_change(context, caller, action_id)
    stopped = await context.bulk_actions.stop(
        action_id, namespace=caller.namespace_filter, routing_keys=caller.routing_key_filter
    )
    return schemas.json_response(bulk_schemas.action_document(stopped))


@router.post("/{action_id}/resume", response_model=bulk_schemas.BulkActionOut, responses=ERRORS)
async def resume_bulk_action(
    action_id: uuid.UUID, context: Context, caller: auth.Producer
) -> Response:
    """Resume a stopped or failed action where it stopped (409 otherwise)."""
    await _may_change(context, caller, action_id)
    resumed = await context.bulk_actions.resume(
        action_id, namespace=caller.namespace_filter, routing_keys=caller.routing_key_filter
    )
    context.bulk_started()
    return schemas.json_response(bulk_schemas.action_document(resumed))


async def _may_change(
    context: ApiContext, caller: api_keys.Principal, action_id: uuid.UUID
) -> None:
    """Only an admin stops or resumes a requeue (as only an admin makes one)."""
    found = await context.bulk_actions.get(
        action_id, namespace=caller.namespace_filter, routing_keys=caller.routing_key_filter
    )
    if found.action is bulk.Action.REQUEUE and not caller.has(api_keys.Scope.ADMIN):
        raise errors.Forbidden(auth.denied(caller, api_keys.Scope.ADMIN))
