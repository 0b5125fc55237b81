"""FlowRuleStore: the only code that runs SQL on flow rules; returns ``flow.rules`` records."""

from __future__ import annotations

import asyncio
import builtins
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from dispatcher import errors
from dispatcher.flow.looks import MeteredLook
from dispatcher.flow.rules import Limits, Owner, Rule
from dispatcher.models import DueEntry, routing_key_of
from dispatcher.store.db import Database
from dispatcher.store.queries import flow_rules as queries


@dataclass(frozen=True, slots=True, kw_only=True)
class Meter:
    """What a metered rule lets go: at most ``rate_per_s`` jobs a second in bursts of ``burst``,
    and at most ``max_in_flight`` let go and not finished, a silent one's slot free again after
    ``in_flight_timeout_s`` (None: no such limit)."""

    rate_per_s: float | None = None
    burst: int | None = None
    max_in_flight: int | None = None
    in_flight_timeout_s: float | None = None

    @classmethod
    def of(cls, limits: Limits) -> Meter:
        return cls(
            rate_per_s=limits.rate_per_s,
            burst=limits.burst,
            max_in_flight=limits.max_in_flight,
            in_flight_timeout_s=limits.in_flight_timeout_s,
        )


def rule_from_row(row: asyncpg.Record) -> Rule:
    return Rule(
        key=row["key"],
        namespace=row["namespace"],
        limits=Limits(
            paused=row["paused"],
            paused_until=row["paused_until"],
            note=row["note"],
            rate_per_s=row["rate_per_s"],
            burst=row["burst"],
            max_in_flight=row["max_in_flight"],
            in_flight_timeout_s=row["in_flight_timeout_s"],
        ),
        updated_at=row["updated_at"],
        owner=Owner(row["owner"]),
    )


class FlowRuleStore:
    """``max_rules``: the most the operators' rules may be, together; ``max_rules_per_namespace``:
    the most each namespace's tenant's may be. Neither counts the other's, so no tenant filling
    its cap keeps another, or an operator, from making a rule."""

    def __init__(self, db: Database, *, max_rules: int, max_rules_per_namespace: int) -> None:
        self._db = db
        self._max_rules = max_rules
        self._max_rules_per_namespace = max_rules_per_namespace

    async def snapshot(self) -> tuple[int, list[Rule]]:
        """Every rule, and the epoch they were read at. The rows become records in a worker
        thread (ten thousand take tens of milliseconds): the event loop answers meanwhile."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.FLOW_RULES)
        stored = await asyncio.to_thread(
            lambda: [rule_from_row(row) for row in rows if row["key"] is not None]
        )
        return rows[0]["epoch"], stored

    async def epoch(self) -> int:
        """The count of changes so far: a node reads the rules again when it moved."""
        async with self._db.connection() as connection:
            epoch: int = await connection.fetchval(queries.FLOW_RULES_EPOCH)
        return epoch

    async def list(self, namespace: str | None) -> list[Rule]:
        """The rules of ``namespace`` ("" the default), or every rule (None)."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(queries.LIST_FLOW_RULES, namespace)
        return [rule_from_row(row) for row in rows]

    async def get(self, key: str, namespace: str | None) -> Rule:
        async with self._db.connection() as connection:
            row = await connection.fetchrow(queries.GET_FLOW_RULE, key, namespace)
        if row is None:
            raise errors.FlowRuleNotFound(_named(key, namespace))
        return rule_from_row(row)

    async def put(self, key: str, namespace: str | None, limits: Limits, *, owner: Owner) -> Rule:
        """Create or replace the rule of ``key`` in ``namespace`` (None: every namespace), as
        ``owner``'s: ``FlowRuleOwned`` for a tenant's change of an operator's rule,
        ``FlowRuleLimitReached`` past the owner's cap."""
        async with self._db.connection() as connection, connection.transaction():
            await connection.execute(queries.LOCK_FLOW_RULES)
            existing = await connection.fetchrow(queries.GET_FLOW_RULE, key, namespace)
            if existing is not None and existing["owner"] != owner:
                _check_owner(owner, key, namespace)
            if existing is None or existing["owner"] != owner:  # one more for this owner
                await self._check_cap(connection, owner, namespace)
            row = await connection.fetchrow(
                queries.PUT_FLOW_RULE,
                key,
                namespace,
                limits.paused,
                limits.paused_until,
                limits.note,
                limits.rate_per_s,
                limits.burst,
                limits.max_in_flight,
                limits.in_flight_timeout_s,
                owner.value,
            )
        assert row is not None
        return rule_from_row(row)

    async def _check_cap(
        self, connection: asyncpg.pool.PoolConnectionProxy, owner: Owner, namespace: str | None
    ) -> None:
        held: int = await connection.fetchval(queries.COUNT_FLOW_RULES, owner.value, namespace)
        if owner is Owner.OPERATOR and held >= self._max_rules:
            raise errors.FlowRuleLimitReached(
                f"operators hold {held} flow rules, the most DISPATCHER_MAX_FLOW_RULES allows:"
                " delete one first"
            )
        if owner is Owner.TENANT and held >= self._max_rules_per_namespace:
            raise errors.FlowRuleLimitReached(
                f"namespace {namespace!r} holds {held} flow rules, the most"
                " DISPATCHER_MAX_FLOW_RULES_PER_NAMESPACE allows: delete one first"
            )

    async def take(
        self, key: str, namespace: str | None, meter: Meter, wanted: Sequence[uuid.UUID]
    ) -> tuple[uuid.UUID, ...]:
        """Let go what the rule of ``key`` in ``namespace`` allows of ``wanted`` (oldest first)
        now, across the cluster: tokens of its rate, slots of its jobs in flight. The ids let go,
        a prefix of ``wanted``; what they took is spent (a job let go and not fired keeps its
        slot until it is fired and finished, or the slot times out)."""
        if not wanted:
            return ()
        async with self._db.connection() as connection:
            taken: Sequence[uuid.UUID] = await connection.fetchval(
                queries.FLOW_TAKE,
                key,
                namespace,
                meter.rate_per_s,
                meter.burst,
                meter.max_in_flight,
                meter.in_flight_timeout_s,
                [*wanted],
            )
        return tuple(taken)

    async def metered_due(
        self, shards: Sequence[int], looks: Sequence[MeteredLook], tags: str
    ) -> dict[int, builtins.list[DueEntry]]:
        """By tag, the due scheduled jobs of ``shards`` each look's rule governs, oldest first
        (``queries.METERED_DUE``; ``tags``: ``RuleBook.governing_tags``)."""
        found: dict[int, builtins.list[DueEntry]] = {look.tag: [] for look in looks}
        if not looks or not shards:
            return found
        async with self._db.connection() as connection:
            rows = await connection.fetch(
                queries.METERED_DUE,
                list(shards),
                [look.rule.key for look in looks],
                [look.rule.namespace for look in looks],
                [look.tag for look in looks],
                [look.wanted for look in looks],
                [look.floor for look in looks],
                tags,
            )
        for row in rows:
            found[row["tag"]].append(
                DueEntry.make(
                    row["run_at"].timestamp(),
                    row["id"],
                    row["shard"],
                    routing_key_of(row["routing_key"]),
                    row["priority"],
                )
            )
        return found

    async def metered_waking(
        self, shards: Sequence[int], since: datetime, first_words: Sequence[str], tags: str
    ) -> tuple[datetime, set[int]]:
        """The time of the look, and the tags of the rules that govern a job of ``shards`` due
        since ``since`` (``queries.METERED_WAKING``)."""
        async with self._db.connection() as connection:
            rows = await connection.fetch(
                queries.METERED_WAKING, list(shards), since, list(first_words), tags
            )
        woken = {int(row["tag"]) for row in rows if row["tag"] is not None}
        return rows[0]["looked_at"], {tag for tag in woken if tag >= 0}

    async def delete(self, key: str, namespace: str | None, *, owner: Owner) -> Rule:
        """Delete the rule (``FlowRuleOwned``: a tenant's delete of an operator's rule)."""
        async with self._db.connection() as connection:
            row = await connection.fetchrow(queries.DELETE_FLOW_RULE, key, namespace, owner.value)
            if row is None and await connection.fetchrow(queries.GET_FLOW_RULE, key, namespace):
                _check_owner(owner, key, namespace)
        if row is None:
            raise errors.FlowRuleNotFound(_named(key, namespace))
        return rule_from_row(row)


def _check_owner(owner: Owner, key: str, namespace: str | None) -> None:
    """A tenant may not change an operator's rule (an operator may change a tenant's)."""
    if owner is Owner.TENANT:
        raise errors.FlowRuleOwned(
            f"the flow rule for {key!r} in namespace {namespace!r} is an operator's: only an"
            " admin key changes it"
        )


def _named(key: str, namespace: str | None) -> str:
    where = "every namespace" if namespace is None else f"namespace {namespace!r}"
    return f"no flow rule for {key!r} in {where}"
