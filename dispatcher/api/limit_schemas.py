"""Request and response models of /v1/limits (flow rules: ``flow.rules``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool

from dispatcher.flow import rules
from dispatcher.flow.rules import Rule

NOTE = Field(None, max_length=rules.MAX_NOTE_LENGTH, description="why, for the next operator")


class LimitsIn(BaseModel):
    """A rule's limits, replacing the rule's (PUT)."""

    model_config = ConfigDict(extra="forbid")

    paused: StrictBool = Field(description="hold the key's jobs (scheduled, never published)")
    paused_until: AwareDatetime | None = Field(
        None, description="the pause ends by itself then (default: when resumed)"
    )
    note: str | None = NOTE


class PauseIn(BaseModel):
    """Pause a key (creating its rule, or pausing the one it has)."""

    model_config = ConfigDict(extra="forbid")

    until: AwareDatetime | None = Field(None, description="end the pause by itself then")
    note: str | None = NOTE


class RuleOut(BaseModel):
    key: str
    namespace: str | None = Field(description='null: every namespace; "": the default')
    paused: bool
    paused_until: datetime | None
    note: str | None
    holding: bool = Field(description="whether the rule holds its jobs now")
    updated_at: datetime


class RulePage(BaseModel):
    limits: list[RuleOut]


def rule_document(rule: Rule, now: datetime) -> dict[str, object]:
    return {
        "key": rule.key,
        "namespace": rule.namespace,
        "paused": rule.limits.paused,
        "paused_until": rule.limits.paused_until,
        "note": rule.limits.note,
        "holding": rule.limits.holds_at(now),
        "updated_at": rule.updated_at,
    }
