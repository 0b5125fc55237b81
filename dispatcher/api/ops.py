"""Operations: liveness, readiness, metrics, the cluster view."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from dispatcher.api.jobs import NodeDep

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready; `checks` names what failed"}})
async def readyz(node: NodeDep) -> JSONResponse:
    """200 when PostgreSQL and RabbitMQ answer and this node owns shards; 503 otherwise."""
    checks = await node.readiness()
    ready = all(checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(node: NodeDep) -> Response:
    """Prometheus text format."""
    return Response(node.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/cluster")
async def cluster(node: NodeDep) -> dict[str, object]:
    """This node, the leader, the members, and the shards each owns with their epochs."""
    return await node.ownership.describe()
