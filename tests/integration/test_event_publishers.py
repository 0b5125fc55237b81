"""Recording consumer events on PostgreSQL: with DISPATCHER_EVENT_USERS an event counts only from
a broker user granted its job; a job keeps a few ignored events and counts the rest; the outcome
that wins is the one received last, whatever date its consumer gave it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from consumers_sdk import contract
from dispatcher import models
from dispatcher.amqp import event_users
from dispatcher.store.db import Database
from dispatcher.store.history import IGNORED_KEPT, HistoryStore
from dispatcher.store.jobs import JobStore
from dispatcher.store.shards import ShardStore
from tests.support import dispatched

GRANTS = event_users.parse("billing-consumer=billing.,acme-consumer=acme:")
FAR_AHEAD = datetime(2100, 1, 1, tzinfo=UTC)


async def test_with_grants_an_event_counts_only_from_a_user_granted_its_jobs_key_or_namespace(
    db: Database, database_url: str
) -> None:
    history = HistoryStore(db, GRANTS)
    billing, billing_round = await dispatched.insert_dispatched(database_url)
    payments, payments_round = await dispatched.insert_dispatched(
        database_url, routing_key="payments.charge"
    )
    acme, acme_round = await dispatched.insert_dispatched(
        database_url, routing_key="x.y", namespace="acme"
    )

    def dead(job_id: uuid.UUID, dispatch_round: uuid.UUID | None, key: str) -> contract.JobEvent:
        return dispatched.event(job_id, "dead", dispatch_round=dispatch_round, routing_key=key)

    forged = [
        dead(billing, billing_round, dispatched.ROUTING_KEY),
        dead(billing, billing_round, dispatched.ROUTING_KEY),
        dead(payments, payments_round, "payments.charge"),
        dead(acme, acme_round, "x.y"),
    ]
    recorded = await history.record(
        forged, [None, "payments-consumer", "billing-consumer", "billing-consumer"]
    )
    assert [entry.ignored for entry in recorded] == [
        "no_user",
        "publisher",
        "publisher",
        "publisher",
    ]
    for job_id in (billing, payments, acme):
        assert await dispatched.state_of(database_url, job_id) == ("dispatched", None)

    own = [
        dead(billing, billing_round, dispatched.ROUTING_KEY),
        dead(acme, acme_round, "x.y"),
    ]
    recorded = await history.record(own, ["billing-consumer", "acme-consumer"])
    assert [entry.ignored for entry in recorded] == [None, None]
    assert (await dispatched.state_of(database_url, billing))[0] == "dead"
    assert (await dispatched.state_of(database_url, acme))[0] == "dead"
    steps = [(e.outcome, e.ignored) for e in await history.events(billing)]
    assert sorted(steps, key=str) == sorted(
        [("dead", "no_user"), ("dead", "publisher"), ("dead", None)], key=str
    )


async def test_a_job_keeps_its_first_ignored_events_and_counts_the_rest(
    db: Database, database_url: str
) -> None:
    history = HistoryStore(db)
    job_id, real_round = await dispatched.insert_dispatched(database_url)

    def forged() -> contract.JobEvent:
        return dispatched.event(job_id, "dead", dispatch_round=uuid.uuid4(), error="forged")

    first = [forged() for _ in range(3)]
    flood = [forged() for _ in range(10)]
    assert len(await history.record(first)) == 3
    recorded = await history.record(flood)
    # Every one is counted in the metrics, kept or not.
    assert [entry.ignored for entry in recorded] == ["other_round"] * 10
    # A redelivery of kept ones: past the bound now, counted again.
    assert [entry.ignored for entry in await history.record(first)] == ["other_round"] * 3

    kept = await history.history(job_id)
    assert [e.ignored for e in kept.events] == ["other_round"] * IGNORED_KEPT
    assert kept.ignored_dropped == 3 + 10 - IGNORED_KEPT + 3
    assert await dispatched.state_of(database_url, job_id) == ("dispatched", None)

    # The job's own outcome is never held back by the bound.
    [own] = await history.record([dispatched.event(job_id, "succeeded", dispatch_round=real_round)])
    assert own.ignored is None
    assert await dispatched.state_of(database_url, job_id) == ("succeeded", None)
    assert (await history.history(job_id)).ignored_dropped == 11


async def test_an_outcome_dated_far_ahead_loses_to_one_received_after_it(
    db: Database, database_url: str
) -> None:
    history = HistoryStore(db)
    job_id, dispatch_round = await dispatched.insert_dispatched(database_url)
    await history.record(
        [
            dispatched.event(job_id, "succeeded", dispatch_round=dispatch_round, at=FAR_AHEAD),
            dispatched.event(job_id, "dead", dispatch_round=dispatch_round, error="real"),
        ]
    )
    assert await dispatched.state_of(database_url, job_id) == ("dead", "real")


async def test_before_the_confirm_the_outcome_received_last_wins_whatever_its_date(
    db: Database, database_url: str
) -> None:
    jobs = JobStore(db, node_id="n1", lease_s=30)
    history = HistoryStore(db)
    shards = ShardStore(db)
    await shards.ensure(4)
    job_id, _ = await dispatched.insert_dispatched(database_url, state="scheduled")
    [claimed] = (
        await jobs.claim(
            [models.DueEntry.make(datetime.now(UTC).timestamp() + 1, job_id, 0)],
            await shards.bump([0], "n1"),
        )
    ).jobs
    ahead = dispatched.event(
        job_id, "succeeded", dispatch_round=claimed.dispatch_round, at=FAR_AHEAD
    )
    later = dispatched.event(job_id, "dead", dispatch_round=claimed.dispatch_round, error="real")
    await history.record([ahead])
    assert await dispatched.state_of(database_url, job_id) == ("succeeded", None)
    await history.record([later])  # received last, dated before the other
    assert await dispatched.state_of(database_url, job_id) == ("dead", "real")
    await jobs.mark_dispatched([job_id])  # the confirm changes a settled job no more
    assert await dispatched.state_of(database_url, job_id) == ("dead", "real")
