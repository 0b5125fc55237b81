"""The job states and event outcomes SQL spells out, held equal to the Python sets they mean:
a state or outcome added on one side only would make a statement silently skip it."""

from __future__ import annotations

import re

import pytest

from consumers_sdk import bulk_rules, contract
from dispatcher import models
from dispatcher.store import migrate
from dispatcher.store.queries import bulk_actions, history, job_reads


def spelled(sql: str, column: str) -> list[set[str]]:
    """Each set ``sql`` tests ``column`` against with ``IN (...)``, as written."""
    pattern = rf"\b{column} IN \(([^)]*)\)"
    return [set(re.findall(r"'([^']*)'", found)) for found in re.findall(pattern, sql)]


def test_retention_deletes_the_finished_states() -> None:
    assert spelled(history.DELETE_FINISHED, "state") == [set(models.FINISHED_STATES)]


@pytest.mark.parametrize("sql", [history.RECORD_EVENTS])
def test_a_jobs_final_outcomes_are_the_contracts(sql: str) -> None:
    found = spelled(sql, "outcome")
    assert found
    assert all(outcomes == set(contract.FINAL_OUTCOMES) for outcomes in found)


def test_every_state_is_counted_by_one_statement() -> None:
    # A state missing from INDEXED_STATES is counted by reading the table, which is right only
    # for those no index names.
    unindexed = {state.value for state in models.JobState} - history.INDEXED_STATES
    assert unindexed == {"dispatched", "succeeded"}
    assert {state.value for state in models.JobState} >= history.INDEXED_STATES


def sets_tested(sql: str, parameter: str) -> list[set[str]]:
    """Each set ``sql`` tests ``parameter`` ($1, say) against with ``IN (...)``, as written."""
    pattern = rf"{re.escape(parameter)} IN \(([^)]*)\)"
    return [set(re.findall(r"'([^']*)'", found)) for found in re.findall(pattern, sql)]


def rest_states() -> set[str]:
    """The states ``jobs.rest`` holds (sql/0026), which ``jobs_rest`` indexes."""
    generated = r"rest\s+text GENERATED ALWAYS AS \(\s*CASE WHEN state IN \(([^)]*)\)"
    found = [re.search(generated, m.sql) for m in migrate.migration_files()]
    [states] = [set(re.findall(r"'([^']*)'", match[1])) for match in found if match]
    return states


def test_the_branches_that_read_jobs_rest_ask_only_for_the_states_it_holds() -> None:
    # A state named in such a branch but not in rest would find nothing; one of rest's left out
    # would be listed or counted by no branch.
    rest = rest_states()
    assert rest in sets_tested(job_reads.LIST_JOBS, "$1")
    assert rest in sets_tested(history.COUNT_STATE, "$1")
    assert rest | {"scheduled", "dispatching"} == history.INDEXED_STATES
    bulk_states = {s for states in bulk_rules.APPLIES_TO.values() for s in states} - {"scheduled"}
    for sql, parameters in ((bulk_actions._BULK_PICK, "$3$4"), (bulk_actions.BULK_COUNT, "$1$2")):
        for parameter in (parameters[:2], parameters[2:]):
            assert sets_tested(sql, parameter) == [bulk_states], (sql, parameter)
    assert bulk_states <= rest
