"""The SQL that tells a held job (``dispatcher_flow_held`` behind ``queries.not_held``) and the
metered rule that lets it go (``dispatcher_flow_meter_tag``, the meter's looks) against the rule
book they mirror (``flow.rules.RuleBook.holds``), on a real PostgreSQL: for random rules of both
owners, paused, metered or both, routing keys and namespaces, both say the same."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import asyncpg

from dispatcher.flow.rules import Limits, Owner, Rule, RuleBook
from dispatcher.store.queries import shared as queries

NOW = datetime(2026, 11, 29, tzinfo=UTC)
WORDS = ["a", "b", "c", "ab", "a-b", "x:y"]
NAMESPACES = [None, "", "shop", "other"]

# The test the loads make, on one row of literals: true when the job is NOT held.
NOT_HELD = (
    f"SELECT {queries.not_held('', 1)}"
    " FROM (SELECT $3::text AS routing_key, $4::text AS namespace) AS job"
)
# The tag of the metered rule the meter's looks find such a job for (NULL: none).
METER_TAG = "SELECT dispatcher_flow_meter_tag($1, $2, $3::jsonb)"


def routing_key(rng: random.Random) -> str:
    return ".".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))


def rule(rng: random.Random) -> Rule:
    key = ".".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    paused = rng.random() < 0.5
    until = NOW + timedelta(minutes=rng.choice([-1, 1])) if paused and rng.random() < 0.3 else None
    rate = 5.0 if rng.random() < 0.4 or not paused else None
    limits = Limits(paused=paused, paused_until=until, rate_per_s=rate, burst=rate and 1)
    owner = rng.choice(list(Owner))
    namespaces = NAMESPACES if owner is Owner.OPERATOR else NAMESPACES[1:]  # a tenant's: its own
    return Rule(
        key=key, namespace=rng.choice(namespaces), limits=limits, updated_at=NOW, owner=owner
    )


async def test_the_sql_holds_and_meters_exactly_the_jobs_the_rule_book_does(
    database_url: str,
) -> None:
    rng = random.Random(35)
    connection = await asyncpg.connect(database_url)
    try:
        for _ in range(80):
            unique = {
                (r.key, r.namespace): r for r in (rule(rng) for _ in range(rng.randint(1, 12)))
            }
            book = RuleBook(unique.values())
            held = book.holding(NOW)
            metered = book.metered(NOW)
            tags = book.governing_tags(metered, NOW)
            for _ in range(25):
                key, namespace = routing_key(rng), rng.choice(NAMESPACES)
                holding = book.holds(key, namespace, NOW)
                free = await connection.fetchval(
                    NOT_HELD, held.rules_json, held.first_words, key, namespace
                )
                assert free is (holding is None), (key, namespace, sorted(unique))
                expected_tag = None
                if holding is not None and holding.limits.meters_at(NOW):
                    expected_tag = metered.index(holding)
                tag = await connection.fetchval(METER_TAG, key, namespace, tags)
                assert tag == expected_tag, (key, namespace, sorted(unique))
    finally:
        await connection.close()
