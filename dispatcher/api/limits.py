"""/v1/limits: flow rules, what an operator holds back at dispatch per routing key or prefix
(``flow.rules``). Validate -> store; every node's ``RuleWatch`` applies the change within a
second (this node's at once). No SQL, no AMQP here.

A rule is named by its key and its namespace: the query's ``namespace`` (absent: every
namespace; empty: the default one). A key of scope ``limits`` manages the rules of its own
namespace, within its routing-key prefixes, but for an operator's (403: ``FlowRuleOwned``, checked
by the store under its lock); an admin any rule, which is then an operator's. Each owner has its
own cap on the rules it holds (409)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from consumers_sdk import validation
from dispatcher import errors
from dispatcher.api import auth, limit_schemas, schemas
from dispatcher.api.context import ApiContext, Context
from dispatcher.api.jobs import ERRORS
from dispatcher.auth import api_keys
from dispatcher.flow import rules

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/limits", tags=["limits"])

KeyParam = Annotated[
    str,
    Path(
        min_length=1,
        max_length=rules.MAX_KEY_LENGTH + 1,
        description="a routing key, or a prefix of its words (billing governs billing.invoice)",
    ),
]
NamespaceParam = Annotated[
    str | None,
    Query(
        max_length=64,
        description="the rule's namespace (empty: the default one); absent: every namespace (an"
        " admin's rule), or the caller's own",
    ),
]


def _named(caller: api_keys.Principal, key: str, namespace: str | None) -> tuple[str, str | None]:
    """The rule's stored key and namespace, or 4xx naming the field."""
    try:
        stored = rules.check_key(key)
    except rules.RuleRefused as exc:
        raise errors.InvalidField(exc.field, exc.message) from None
    where = _namespace(caller, namespace)
    if caller.scope is not api_keys.Scope.ADMIN:
        auth.check_routing_key(caller, stored, "key")
    return stored, where


def _namespace(caller: api_keys.Principal, namespace: str | None) -> str | None:
    """The namespace a caller names: an admin's as given, another's its own (403 for another)."""
    if namespace and (problem := validation.namespace_problem(namespace)):
        raise errors.InvalidField("namespace", problem)
    if caller.scope is api_keys.Scope.ADMIN:
        return namespace
    own = caller.namespace or ""
    if namespace is not None and namespace != own:
        raise errors.Forbidden(
            f"this key manages the rules of namespace {own!r} only", field="namespace"
        )
    return own


def _checked(
    limits: rules.Limits, context: ApiContext, *, named: dict[str, str] | None = None
) -> rules.Limits:
    """The limits if storable, else 422 naming the field (as the body names it: ``named``)."""
    try:
        return rules.check(limits, context.now_dt())
    except rules.RuleRefused as exc:
        field = (named or {}).get(exc.field, exc.field)
        raise errors.InvalidField(field, exc.message.replace(exc.field, field)) from None


def _answer(context: ApiContext, rule: rules.Rule, status_code: int = 200) -> Response:
    return schemas.json_response(limit_schemas.rule_document(rule, context.now_dt()), status_code)


@router.get("", response_model=limit_schemas.RulePage, responses=ERRORS)
async def list_limits(
    context: Context, caller: auth.Limits, namespace: NamespaceParam = None
) -> Response:
    """The rules: an admin's, every one (or one namespace's); others, their namespace's."""
    found = await context.flow_rules.list(_namespace(caller, namespace))
    if caller.routing_key_filter is not None:
        found = [rule for rule in found if caller.may_route(rule.key)]
    now = context.now_dt()
    return schemas.json_response(
        {"limits": [limit_schemas.rule_document(rule, now) for rule in found]}
    )


@router.get("/{key}", response_model=limit_schemas.RuleOut, responses=ERRORS)
async def get_limit(
    key: KeyParam, context: Context, caller: auth.Limits, namespace: NamespaceParam = None
) -> Response:
    stored, where = _named(caller, key, namespace)
    return _answer(context, await context.flow_rules.get(stored, where))


@router.put("/{key}", response_model=limit_schemas.RuleOut, responses=ERRORS)
async def put_limit(
    key: KeyParam,
    body: limit_schemas.LimitsIn,
    context: Context,
    caller: auth.Limits,
    namespace: NamespaceParam = None,
) -> Response:
    """Create or replace the rule of this key in this namespace."""
    stored, where = _named(caller, key, namespace)
    limits = _checked(limit_schemas.to_limits(body), context)
    return await _put(context, caller, "set", stored, where, limits)


@router.delete("/{key}", response_model=limit_schemas.RuleOut, responses=ERRORS)
async def delete_limit(
    key: KeyParam, context: Context, caller: auth.Limits, namespace: NamespaceParam = None
) -> Response:
    """Delete the rule: its jobs go as if it never was. Answers the rule deleted."""
    stored, where = _named(caller, key, namespace)
    return await _delete(context, caller, "deleted", stored, where)


@router.post("/{key}/pause", response_model=limit_schemas.RuleOut, responses=ERRORS)
async def pause_key(
    key: KeyParam,
    body: limit_schemas.PauseIn,
    context: Context,
    caller: auth.Limits,
    namespace: NamespaceParam = None,
) -> Response:
    """Hold the key's jobs until resumed (or ``until``); a metered rule keeps its meter, which
    lets the jobs go again once the pause ends."""
    stored, where = _named(caller, key, namespace)
    existing = await _existing(context, stored, where)
    asked = dataclasses.replace(existing, paused=True, paused_until=body.until, note=body.note)
    limits = _checked(asked, context, named={"paused_until": "until"})
    return await _put(context, caller, "paused", stored, where, limits)


@router.post("/{key}/resume", response_model=limit_schemas.RuleOut, responses=ERRORS)
async def resume_key(
    key: KeyParam, context: Context, caller: auth.Limits, namespace: NamespaceParam = None
) -> Response:
    """Let the key's held jobs go, oldest due first. A rule that only pauses is deleted (answered
    as it was); a metered one is unpaused, its meter and note kept (answered as it is now), so
    its jobs go at its rate."""
    stored, where = _named(caller, key, namespace)
    rule = await context.flow_rules.get(stored, where)
    if not rule.limits.meters:
        return await _delete(context, caller, "resumed", stored, where)
    unpaused = dataclasses.replace(rule.limits, paused=False, paused_until=None)
    return await _put(context, caller, "resumed", stored, where, _checked(unpaused, context))


async def _existing(context: ApiContext, key: str, namespace: str | None) -> rules.Limits:
    """The rule's limits, or none (no rule yet)."""
    try:
        return (await context.flow_rules.get(key, namespace)).limits
    except errors.FlowRuleNotFound:
        return rules.Limits()


async def _put(
    context: ApiContext,
    caller: api_keys.Principal,
    what: str,
    key: str,
    namespace: str | None,
    limits: rules.Limits,
) -> Response:
    rule = await context.flow_rules.put(key, namespace, limits, owner=_owner(caller))
    await _changed(context, caller, what, rule)
    return _answer(context, rule)


async def _delete(
    context: ApiContext, caller: api_keys.Principal, what: str, key: str, namespace: str | None
) -> Response:
    rule = await context.flow_rules.delete(key, namespace, owner=_owner(caller))
    await _changed(context, caller, what, rule)
    return _answer(context, rule)


def _owner(caller: api_keys.Principal) -> rules.Owner:
    """Whose the rules a caller sets are: an admin key's the operator's, others their tenant's."""
    return rules.Owner.OPERATOR if caller.scope is api_keys.Scope.ADMIN else rules.Owner.TENANT


async def _changed(
    context: ApiContext, caller: api_keys.Principal, what: str, rule: rules.Rule
) -> None:
    await context.rules_changed()  # this node applies it before answering; the others within 1 s
    logger.info(
        "flow rule %s: %s in %s by key %s",
        what,
        rule.key,
        "every namespace" if rule.namespace is None else repr(rule.namespace),
        caller.key,
        extra={"action": "flow_rule"},
    )
