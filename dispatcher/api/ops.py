"""Operations: liveness, readiness, metrics, the cluster view."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from dispatcher import keys
from dispatcher.api import auth, schemas
from dispatcher.api.jobs import NodeDep

router = APIRouter(tags=["operations"])

# Every route here but /healthz takes a key once keys are configured.
REFUSALS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.Problem, "content": {"application/json": {}}} for code in (401, 403)
}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={503: {"description": "not ready; `checks` names what failed"}, **REFUSALS},
)
async def readyz(node: NodeDep, caller: auth.AnyKey) -> JSONResponse:
    """200 when PostgreSQL and RabbitMQ answer and this node owns shards; 503 otherwise."""
    checks = await node.readiness()
    ready = all(checks.values())
    auth_mode = "off" if caller is keys.OPEN_ACCESS else "on"
    return JSONResponse(
        {"status": "ready" if ready else "not ready", "checks": checks, "auth": auth_mode},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", response_class=PlainTextResponse, responses=REFUSALS)
async def metrics(node: NodeDep, caller: auth.Monitor) -> Response:
    """Prometheus text format."""
    return Response(node.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/cluster", responses=REFUSALS)
async def cluster(node: NodeDep, caller: auth.Admin) -> dict[str, object]:
    """This node, the leader, the members, and the shards each owns with their epochs."""
    return await node.ownership.describe()
