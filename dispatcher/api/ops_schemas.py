"""Response models of the operations routes (``ops.py``): each answer has its schema in the
OpenAPI document, so a client generated from it gets a typed result rather than nothing."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok"]


class ClockState(BaseModel):
    """This node's clock against PostgreSQL's, the one it fires on."""

    trusted: bool = Field(description="whether the node fires: false stops it (see `reason`)")
    offset_s: float | None = Field(
        description="this host's wall clock minus PostgreSQL's, last measured (null: not yet)"
    )
    error_s: float | None = Field(
        description="how far the node's time (PostgreSQL's, measured) may be off, in seconds"
    )
    max_offset_s: float = Field(description="the offset past which the node stops firing")
    steps: int = Field(description="times a clock was seen to step since the node started")
    reason: str | None = Field(
        default=None, description="why the clock is not trusted (admin keys; others: withheld)"
    )


class FailingService(BaseModel):
    for_s: float = Field(description="for how long its probes or firing have failed")
    reason: str = Field(description="the last failure (admin keys; others: withheld)")


class StandingState(BaseModel):
    """What this node can do now: in a cluster, a node that cannot do its work for longer than
    the step-out bound gives its shards to the others."""

    standing: Literal["ok", "failing", "out", "recovering"] = Field(
        description="ok; failing: a service failing, for less than `step_out_s`; out: failing "
        "longer, its shards go to the other nodes; recovering: well again, waiting to rejoin"
    )
    for_s: float = Field(description="how long the node has had this standing")
    step_out_s: float = Field(description="the step-out bound (DISPATCHER_STEP_OUT_S)")
    failing: dict[str, FailingService] = Field(
        description="the failing services (postgres, rabbitmq, clock)"
    )
    last_ok_s_ago: dict[str, float | None] = Field(
        description="how long ago each service last answered a probe (null: never)"
    )
    last_claim_s_ago: float | None = Field(description="since firing last claimed jobs")
    last_confirm_s_ago: float | None = Field(description="since RabbitMQ last confirmed one")
    rejoin_in_s: float | None = Field(
        default=None, description="recovering: when the node takes shards again"
    )
    reason: str | None = Field(
        default=None, description="why the standing is not ok (admin keys; others: withheld)"
    )


class VacuumState(BaseModel):
    """The oldest snapshot holding PostgreSQL's vacuum back (a long transaction, a pg_dump, a
    prepared transaction, a replication slot): while it lasts, dead rows pile up in the queue's
    tables and indexes."""

    held_back: bool = Field(description="whether the oldest is older than `warn_after_s`")
    oldest_snapshot_s: float | None = Field(
        description="its age in seconds (a slot's: since this node first saw it); null: none "
        "held, or not looked at yet"
    )
    warn_after_s: float = Field(description="DISPATCHER_SNAPSHOT_WARN_S")
    sees_all_sessions: bool = Field(
        description="false when the node's database role cannot see when other roles' "
        "transactions began (grant it pg_monitor): their age then counts from the node's first "
        "look"
    )
    xmin_age: int | None = Field(
        default=None, description="how many transactions old the xmin it holds is"
    )
    holder: str | None = Field(
        default=None,
        description="what holds it: a session's pid and application, a prepared transaction, a "
        "replication slot (admin keys; others: withheld)",
    )


class Readiness(BaseModel):
    """The answer of /readyz, 200 (ready) or 503 (not)."""

    status: Literal["ready", "not ready"]
    checks: dict[str, bool] = Field(description="each check by name: true when it passed")
    auth: Literal["on", "off"] = Field(description="whether API keys are required")
    clock: ClockState
    standing: StandingState
    vacuum: VacuumState
    publish_path: dict[str, str | None] = Field(
        description="firing's publish path (`path`) and why it fell back (`fallback_reason`, "
        "withheld but for admin keys)"
    )
    degraded: dict[str, str] | None = Field(
        default=None,
        description="the failing background loops with their last error, `clock` with its "
        "reason while the clock is not trusted, and `standing` with its reason while it is not "
        "ok; the reasons are for admin keys, others get a placeholder (the node logs them)",
    )


class QueueOut(BaseModel):
    name: str
    messages: int | None = Field(description="null when RabbitMQ keeps no count for the queue")


# /v1/stats answers an object whose keys follow the data (states, routing keys): its route's
# description says what each holds.
OBJECT: dict[str, Any] = {
    "content": {"application/json": {"schema": {"type": "object", "additionalProperties": True}}}
}
