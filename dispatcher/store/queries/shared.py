"""Fragments more than one family's statements are built from."""

from typing import Final


# Jobs a flow rule holds (``flow.rules``) stay scheduled and are passed over by the loads, the
# straggler look and the claims: two parameters from ``first`` on are ``rules.HeldKeys``'s rules
# (jsonb) and first words, both empty when nothing is held. The function is called only for a
# job whose routing key starts with a rule's first word: the rest cost one comparison against
# that short array. ``alias`` prefixes the job's columns. ``dispatcher_claim_v1`` (sql/0029)
# makes the same test in its own text: the claims' tests of held keys pin it there.
def not_held(alias: str, first: int) -> str:
    rules, words = f"${first}", f"${first + 1}"
    return (
        f"(cardinality({words}::text[]) = 0"
        f" OR split_part({alias}routing_key, '.', 1) <> ALL({words}::text[])"
        f" OR NOT dispatcher_flow_held({alias}routing_key, {alias}namespace, {rules}::jsonb))"
    )


# The statements that change jobs named by id find them by id (jobs_pkey), and the sweep of
# leases through their claims' rows (sql/0030); all test the state row by row: ``IN_FLIGHT`` is a
# CASE, which the planner cannot answer from an index. Written as ``state = 'dispatching'``, it
# let the planner read the whole 'dispatching' range of jobs_state or of a partial index
# instead, small in its statistics; but while a snapshot is held (a report, a pg_dump) that range
# keeps a dead entry for every job fired since, and the confirm's mark read 10 000 buffers a call
# after six minutes (bench/held_snapshot.py).
IN_FLIGHT: Final = "CASE state WHEN 'dispatching' THEN true ELSE false END"


# Whether a claim's job is still in flight under it (sql/0030): its row dispatching with the
# claim's lease and node. A confirm, a release, an expiry or a park clears the row's lease, and a
# later claim of the job gives it another: then it is not. ``job`` and ``claim`` are the aliases.
def in_flight_under(job: str, claim: str) -> str:
    return (
        f"({job}.state = 'dispatching' AND {job}.lease_until = {claim}.lease_until"
        f" AND {job}.claimed_by IS NOT DISTINCT FROM {claim}.node)"
    )


# A CTE (``async_commit``, one row: ``committed`` true) that commits the statement's transaction
# without waiting for its WAL to reach the disk (``synchronous_commit`` off for this transaction
# alone: a local setting is read at the commit, then dropped). Only for a write whose loss in a
# crash of PostgreSQL repeats a job, which at-least-once allows; never for accepting one. The
# statement must read it (``AND (SELECT committed FROM async_commit)``): a CTE no one reads is
# not run.
ASYNC_COMMIT: Final = (
    "async_commit AS (SELECT set_config('synchronous_commit', 'off', true) = 'off' AS committed)"
)

# The transaction's next statements are planned with their values each time they run, never from a
# plan cached for the prepared statement.
PLAN_EACH_RUN: Final = "SET LOCAL plan_cache_mode = force_custom_plan"


def note_events(
    source: str,
    *,
    job_id: str,
    outcome: str,
    consumer: str,
    event_id: str = "gen_random_uuid()",
    attempt: str = "0",
    group: str = "'dispatcher'::text",
    error: str = "NULL::text",
    at: str = "now()",
    round_: str = "NULL::uuid",
    ignored: str = "NULL::text",
    detail: str = "NULL::text",
) -> str:
    """The INSERT of one event batch (``event_batches``, sql/0025): an event for each row of
    ``source`` (a FROM item: a CTE's name, or a subquery with its alias), its fields these
    expressions over the row, in the rows' order. Nothing is inserted when there are none.

    The aggregates read one stream of rows, so the arrays stay aligned; a subquery's ORDER BY
    gives them their order (a plain aggregate keeps its input's)."""
    return f"""INSERT INTO event_batches (job_keys, event_ids, job_ids, outcomes, attempts,
                           consumer_groups, consumers, errors, ats, rounds, ignored, details)
SELECT array_agg(DISTINCT dispatcher_id_key({job_id})), array_agg({event_id}),
       array_agg({job_id}), array_agg({outcome}), array_agg({attempt}), array_agg({group}),
       array_agg({consumer}), array_agg({error}), array_agg({at}), array_agg({round_}),
       array_agg({ignored}), array_agg({detail})
FROM {source}
HAVING count(*) > 0"""


def note_rows(source: str) -> str:
    """``note_events`` of rows that carry an event's fields under ``EVENT_ENTRIES``' names
    (event_id, job_id, outcome, attempt, consumer_group, consumer, error, at, round, ignored)."""
    return note_events(
        source,
        event_id="event_id",
        job_id="job_id",
        outcome="outcome",
        attempt="attempt",
        group="consumer_group",
        consumer="consumer",
        error="error",
        at="at",
        round_="round",
        ignored="ignored",
    )


# Every stored event, a row each (a FROM item): the batch as ``b``, the event's fields as ``e``,
# with its position in the batch (the order received is ``b.id``, then ``e.position``).
EVENT_ENTRIES: Final = """event_batches b
CROSS JOIN LATERAL unnest(b.event_ids, b.job_ids, b.outcomes, b.attempts, b.consumer_groups,
                          b.consumers, b.errors, b.ats, b.rounds, b.ignored, b.details)
    WITH ORDINALITY
    AS e(event_id, job_id, outcome, attempt, consumer_group, consumer, error, at, round,
         ignored, detail, position)"""


# One job's events (``event_batches_job_keys``): the batch's id, then the event's fields and
# position. ``job`` is the expression of the job's id.
def events_of(job: str) -> str:
    return f"""SELECT b.id AS batch, e.*
FROM {EVENT_ENTRIES}
WHERE b.job_keys @> ARRAY[dispatcher_id_key({job})] AND e.job_id = {job}"""
