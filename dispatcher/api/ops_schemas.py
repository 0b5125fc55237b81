"""Response models of the operations routes (``ops.py``): each answer has its schema in the
OpenAPI document, so a client generated from it gets a typed result rather than nothing."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    """The answer of /readyz, 200 (ready) or 503 (not)."""

    status: Literal["ready", "not ready"]
    checks: dict[str, bool] = Field(description="each check by name: true when it passed")
    auth: Literal["on", "off"] = Field(description="whether API keys are required")
    publish_path: dict[str, str | None] = Field(
        description="firing's publish path (`path`) and why it fell back (`fallback_reason`)"
    )
    degraded: dict[str, str] | None = Field(
        default=None, description="the failing background loops with their last error, if any"
    )


class QueueOut(BaseModel):
    name: str
    messages: int | None = Field(description="null when RabbitMQ keeps no count for the queue")


# /v1/stats answers an object whose keys follow the data (states, routing keys): its route's
# description says what each holds.
OBJECT: dict[str, Any] = {
    "content": {"application/json": {"schema": {"type": "object", "additionalProperties": True}}}
}
