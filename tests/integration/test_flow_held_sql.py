"""The SQL that tells a held job (``dispatcher_held`` behind ``queries.not_held``) against the
rule book it mirrors (``flow.rules.RuleBook.holds``), on a real PostgreSQL: for random rules,
routing keys and namespaces, both say the same."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import asyncpg

from dispatcher.flow.rules import Limits, Rule, RuleBook
from dispatcher.store import queries

NOW = datetime(2026, 11, 29, tzinfo=UTC)
WORDS = ["a", "b", "c", "ab", "a-b", "x:y"]
NAMESPACES = [None, "", "shop", "other"]

# The test the loads make, on one row of literals: true when the job is NOT held.
NOT_HELD = (
    f"SELECT {queries.not_held('', 1)}"
    " FROM (SELECT $3::text AS routing_key, $4::text AS namespace) AS job"
)


def routing_key(rng: random.Random) -> str:
    return ".".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))


def rule(rng: random.Random) -> Rule:
    key = ".".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    paused = rng.random() < 0.6
    until = NOW + timedelta(minutes=rng.choice([-1, 1])) if paused and rng.random() < 0.3 else None
    limits = Limits(paused=paused, paused_until=until)
    return Rule(key=key, namespace=rng.choice(NAMESPACES), limits=limits, updated_at=NOW)


async def test_the_sql_holds_exactly_the_jobs_the_rule_book_holds(database_url: str) -> None:
    rng = random.Random(35)
    connection = await asyncpg.connect(database_url)
    try:
        for _ in range(60):
            unique = {
                (r.key, r.namespace): r for r in (rule(rng) for _ in range(rng.randint(1, 12)))
            }
            book = RuleBook(unique.values())
            held = book.holding(NOW)
            for _ in range(25):
                key, namespace = routing_key(rng), rng.choice(NAMESPACES)
                expected = book.holds(key, namespace, NOW) is not None
                free = await connection.fetchval(
                    NOT_HELD,
                    held.rules_json,
                    held.first_words,
                    key,
                    namespace,
                )
                assert free is (not expected), (key, namespace, sorted(unique))
    finally:
        await connection.close()
