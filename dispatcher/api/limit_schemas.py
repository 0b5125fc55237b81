"""Request and response models of /v1/limits (flow rules: ``flow.rules``).

Numbers are strict (a string is refused naming its field); their ranges are ``rules.check``'s, so
one place says what a rule may be and its 422 names the field."""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, StrictInt

from dispatcher.flow import rules
from dispatcher.flow.rules import Rule

NOTE = Field(None, max_length=rules.MAX_NOTE_LENGTH, description="why, for the next operator")
RATE = "at most this many of the key's jobs let go a second, cluster-wide"
BURST = "at most this many let go at once after a quiet spell (only with rate_per_s)"
MAX_IN_FLIGHT = "at most this many of the key's jobs let go and not yet finished, cluster-wide"
TIMEOUT = "a job let go and not heard of for this long gives its slot back (with max_in_flight)"


class LimitsIn(BaseModel):
    """A rule's limits, replacing the rule's (PUT): a pause, a meter, or both."""

    model_config = ConfigDict(extra="forbid")

    paused: StrictBool = Field(
        False, description="hold the key's jobs (scheduled, never published) until resumed"
    )
    paused_until: AwareDatetime | None = Field(
        None, description="the pause ends by itself then (default: when resumed)"
    )
    note: str | None = NOTE
    rate_per_s: float | None = Field(
        None, strict=True, description=f"{RATE}; above 0, at most {rules.MAX_RATE_PER_S:g}"
    )
    burst: StrictInt | None = Field(
        None,
        description=f"{BURST}; 1 to {rules.MAX_COUNT}, default a tenth of a second's worth"
        " (at least 1)",
    )
    max_in_flight: StrictInt | None = Field(
        None, description=f"{MAX_IN_FLIGHT}; 1 to {rules.MAX_COUNT}"
    )
    in_flight_timeout_s: float | None = Field(
        None,
        strict=True,
        description=f"{TIMEOUT}; above 0, at most a week, default"
        f" {rules.DEFAULT_IN_FLIGHT_TIMEOUT_S:g}",
    )


class PauseIn(BaseModel):
    """Pause a key (creating its rule, or pausing the one it has, its meter kept)."""

    model_config = ConfigDict(extra="forbid")

    until: AwareDatetime | None = Field(None, description="end the pause by itself then")
    note: str | None = NOTE


class RuleOut(BaseModel):
    key: str = Field(description="the routing key, or prefix of its words, the rule governs")
    namespace: str | None = Field(description='null: every namespace; "": the default')
    paused: bool = Field(description="the rule pauses its jobs (until resumed or paused_until)")
    paused_until: datetime | None = Field(description="when the pause ends by itself")
    note: str | None = Field(description="why, for the next operator")
    rate_per_s: float | None = Field(description=f"{RATE} (null: no rate)")
    burst: int | None = Field(description=BURST)
    max_in_flight: int | None = Field(description=f"{MAX_IN_FLIGHT} (null: no such limit)")
    in_flight_timeout_s: float | None = Field(description=TIMEOUT)
    holding: bool = Field(description="whether the rule holds its jobs now (paused now)")
    metering: bool = Field(
        description="whether the meter lets the rule's jobs go now (metered, not paused now)"
    )
    updated_at: datetime = Field(description="when the rule was last set")
    owner: rules.Owner = Field(
        description="operator: an admin key set it last (a limits key may not change it, and its"
        " own rules never release what it holds); tenant: its namespace's limits key set it"
    )


class RulePage(BaseModel):
    limits: list[RuleOut] = Field(description="the rules, by key then namespace")


def to_limits(body: LimitsIn) -> rules.Limits:
    """The limits as asked for (``rules.check`` fills the defaults, or names what is wrong)."""
    return rules.Limits(
        paused=body.paused,
        paused_until=body.paused_until,
        note=body.note,
        rate_per_s=body.rate_per_s,
        burst=body.burst,
        max_in_flight=body.max_in_flight,
        in_flight_timeout_s=body.in_flight_timeout_s,
    )


def rule_document(rule: Rule, now: datetime) -> dict[str, object]:
    return {
        "key": rule.key,
        "namespace": rule.namespace,
        "paused": rule.limits.paused,
        "paused_until": rule.limits.paused_until,
        "note": rule.limits.note,
        "rate_per_s": rule.limits.rate_per_s,
        "burst": rule.limits.burst,
        "max_in_flight": rule.limits.max_in_flight,
        "in_flight_timeout_s": rule.limits.in_flight_timeout_s,
        "holding": rule.limits.holds_at(now),
        "metering": rule.limits.meters_at(now),
        "updated_at": rule.updated_at,
        "owner": rule.owner.value,
    }
