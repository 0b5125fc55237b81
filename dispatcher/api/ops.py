"""Operations: liveness, readiness, metrics, statistics, the cluster view.

``/readyz`` and ``/v1/queues`` tell a caller without an admin key which check failed, never the
text behind it: a driver's error names hosts, ports and SQL, which a producer or a probe has no
use for. The node logs that text, and an admin key (every caller while auth is off) sees it."""

from __future__ import annotations

import dataclasses
import logging

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from consumers_sdk import dlq
from consumers_sdk import errors as sdk_errors
from dispatcher.api import auth, ops_schemas, schemas
from dispatcher.api.context import Context
from dispatcher.auth import api_keys

logger = logging.getLogger(__name__)
router = APIRouter(tags=["operations"])
# In place of a reason, for a caller without an admin key.
WITHHELD = "withheld: see the node's log, or ask with an admin key"
QUEUES_UNAVAILABLE = "RabbitMQ's management API did not answer as expected"
NEXT_DUE = 20
# The console's grouped view of what is due: the next hour, per minute and routing key, counted
# over at most DUE_SCANNED jobs (each poll's cost is bounded whatever the backlog).
DUE_WINDOW_S = 3600.0
DUE_GROUPS = 60
DUE_SCANNED = 10_000

# Every route here but /healthz takes a key once keys are configured; the HTTP edge may refuse a
# Host not allowed (400), a body (413), unknown keys tried too fast (429) or a busy node (503).
REFUSALS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.Problem, "content": {"application/json": {}}}
    for code in (400, 401, 403, 413, 429, 503)
}
# /metrics answers text: a model here would document its JSON refusals as text/plain.
METRICS_REFUSALS: dict[int | str, dict[str, object]] = {
    code: {
        "description": "refused",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    for code in REFUSALS
}


@router.get("/healthz", response_model=ops_schemas.Health)
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ops_schemas.Readiness,
    responses={
        **REFUSALS,
        # Its own answer, not ready; or the HTTP edge's refusal of a busy node.
        503: {
            "model": ops_schemas.Readiness | schemas.Problem,
            "description": "not ready (`checks` names what failed), or the node is too busy",
        },
    },
)
async def readyz(context: Context, caller: auth.AnyKey) -> JSONResponse:
    """200 when PostgreSQL and RabbitMQ answer (and the node's probes of them pass), its
    ZooKeeper session is up (in a cluster), it owns shards, its clock is trusted, its standing is
    ok and no background loop is failing; 503 otherwise, with ``degraded`` naming the failing
    loops and their last error, the clock's reason when it is not trusted, and the standing's.
    ``clock`` shows this host's measured offset from PostgreSQL's clock (the one the node fires
    on) either way; ``standing`` what the node can do (``ok``, ``failing``, ``out``: its shards
    go to the others, ``recovering``), the failing services, and how long ago each answered a
    probe and firing last claimed and had a publish confirmed; ``vacuum`` the oldest snapshot
    holding PostgreSQL's vacuum back and whether it is older than DISPATCHER_SNAPSHOT_WARN_S (a
    warning: the node stays ready). The reasons (and the snapshot's holder) (``degraded``'s, the
    clock's, the standing's and each failing service's) are for admin keys: others get
    ``WITHHELD`` in their place."""
    checks = await context.readiness()
    ready = all(checks.values())
    auth_mode = "off" if caller is api_keys.OPEN_ACCESS else "on"
    clock = context.clock()
    standing = context.standing()
    answer: dict[str, object] = {
        "status": "ready" if ready else "not ready",
        "checks": checks,
        "auth": auth_mode,
        "clock": clock,
        "standing": standing,
    }
    # Either path is ready; per_message is only slower (the reason says why it was chosen).
    answer["publish_path"] = context.publish_path()
    # A warning, not a failure: another's snapshot slows every node alike, and none can end it.
    answer["vacuum"] = context.vacuum()
    degraded = context.degraded()  # loop -> its last error, while it restarts
    if not clock.get("trusted", True):
        degraded = {**degraded, "clock": str(clock.get("reason"))}
    if "reason" in standing:
        degraded = {**degraded, "standing": str(standing["reason"])}
    if degraded:
        answer["degraded"] = degraded
    if not caller.has(api_keys.Scope.ADMIN):
        answer = withheld(answer)
    return JSONResponse(answer, status_code=200 if ready else 503)


def withheld(answer: dict[str, object]) -> dict[str, object]:
    """The readiness ANSWER with every free-text reason replaced by ``WITHHELD``: what failed
    stays (the checks, the failing loops and services, the standing), why does not. Pure."""
    shown = dict(answer)
    degraded = answer.get("degraded")
    if isinstance(degraded, dict):
        shown["degraded"] = dict.fromkeys(degraded, WITHHELD)
    for part in ("clock", "standing", "vacuum"):
        state = answer.get(part)
        if isinstance(state, dict):
            shown[part] = state = dict(state)
            for free_text in ("reason", "holder"):
                if state.get(free_text) is not None:
                    state[free_text] = WITHHELD
            failing = state.get("failing")
            if isinstance(failing, dict):
                state["failing"] = {
                    name: {**service, "reason": WITHHELD} if isinstance(service, dict) else service
                    for name, service in failing.items()
                }
    path = answer.get("publish_path")
    if isinstance(path, dict) and path.get("fallback_reason") is not None:
        shown["publish_path"] = {**path, "fallback_reason": WITHHELD}
    return shown


@router.get("/metrics", response_class=PlainTextResponse, responses=METRICS_REFUSALS)
async def metrics(context: Context, caller: auth.Monitor) -> Response:
    """Prometheus text format."""
    return Response(context.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/stats", responses={200: ops_schemas.OBJECT, **REFUSALS})
async def stats(context: Context, caller: auth.Monitor) -> Response:
    """Jobs per state; per state and routing key for the ``stats_routing_keys`` keys with the
    most jobs, the rest of each state in ``other``; ``counted_at``: the oldest state's count
    (each state's in ``counted_at_by_state``). Also the next jobs due and this node's scheduler
    figures. ``next_due_by_minute``: the jobs due in the next ``next_due_window_s`` per minute and
    routing key, counted over at most the next ``next_due_scanned`` jobs."""
    snapshot = context.counts()
    due = await context.history.next_due(NEXT_DUE)
    grouped = await context.history.next_due_by_minute(
        window_s=DUE_WINDOW_S, groups=DUE_GROUPS, scanned=DUE_SCANNED
    )
    return schemas.json_response(
        {
            "counted_at": min(snapshot.counted_at.values(), default=None),
            "counted_at_by_state": snapshot.counted_at,
            "by_state": snapshot.by_state,
            "counts": [dataclasses.asdict(count) for count in snapshot.counts],
            "other": snapshot.other,
            "next_due": [
                {"id": str(d.id), "routing_key": d.routing_key, "run_at": d.run_at} for d in due
            ],
            "next_due_by_minute": [dataclasses.asdict(group) for group in grouped],
            "next_due_window_s": DUE_WINDOW_S,
            "next_due_scanned": DUE_SCANNED,
            "node": context.settings.node_id,
            "heap_size": context.heap_size(),
            "rabbitmq_ui": context.settings.rabbitmq_ui(),
            "rabbitmq_vhost": context.settings.amqp_vhost(),
            "exchange": context.settings.exchange,
        }
    )


@router.get(
    "/v1/queues",
    response_model=list[ops_schemas.QueueOut],
    responses={
        **REFUSALS,
        503: {**REFUSALS[503], "description": "RabbitMQ's management API did not answer"},
    },
)
async def queues(context: Context, caller: auth.Monitor) -> Response:
    """The queues of the dispatcher's vhost with their message counts, from RabbitMQ's
    management API (for the console's links); 503 when it does not answer, with its error to
    an admin key only (the node logs it)."""
    try:
        listed = await dlq.list_queues(
            context.settings.amqp_url, context.settings.amqp_management_url
        )
    except sdk_errors.DlqError as exc:
        logger.warning("GET /v1/queues: %s", exc, extra={"action": "queues_unavailable"})
        message = str(exc) if caller.has(api_keys.Scope.ADMIN) else QUEUES_UNAVAILABLE
        return JSONResponse({"error": "unavailable", "message": message}, status_code=503)
    return schemas.json_response([{"name": n, "messages": m} for n, m in listed])


@router.get("/v1/cluster", responses=REFUSALS)
async def cluster(context: Context, caller: auth.Admin) -> dict[str, object]:
    """This node, the leader, the members, and the shards each owns with their epochs."""
    return await context.cluster()
