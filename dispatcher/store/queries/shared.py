"""Fragments more than one family's statements are built from."""

from typing import Final


# Jobs a flow rule holds (``flow.rules``) stay scheduled and are passed over by the loads, the
# straggler look and the claims: two parameters from ``first`` on are ``rules.HeldKeys``'s rules
# (jsonb) and first words, both empty when nothing is held. The function is called only for a
# job whose routing key starts with a rule's first word: the rest cost one comparison against
# that short array. ``alias`` prefixes the job's columns.
def not_held(alias: str, first: int) -> str:
    rules, words = f"${first}", f"${first + 1}"
    return (
        f"(cardinality({words}::text[]) = 0"
        f" OR split_part({alias}routing_key, '.', 1) <> ALL({words}::text[])"
        f" OR NOT dispatcher_flow_held({alias}routing_key, {alias}namespace, {rules}::jsonb))"
    )


# The statements that change jobs named by id find them by id (jobs_pkey), and the sweep of
# leases by their ends (jobs_lease_until); all test the state row by row: ``IN_FLIGHT`` is a
# CASE, which the planner cannot answer from an index. Written as ``state = 'dispatching'``, it
# let the planner read the whole 'dispatching' range of jobs_state or of a partial index
# instead, small in its statistics; but while a snapshot is held (a report, a pg_dump) that range
# keeps a dead entry for every job fired since, and the confirm's mark read 10 000 buffers a call
# after six minutes (bench/held_snapshot.py).
IN_FLIGHT: Final = "CASE state WHEN 'dispatching' THEN true ELSE false END"

# The transaction's next statements are planned with their values each time they run, never from a
# plan cached for the prepared statement.
PLAN_EACH_RUN: Final = "SET LOCAL plan_cache_mode = force_custom_plan"
