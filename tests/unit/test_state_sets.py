"""The job states and event outcomes SQL spells out, held equal to the Python sets they mean:
a state or outcome added on one side only would make a statement silently skip it."""

from __future__ import annotations

import re

import pytest

from consumers_sdk import contract
from dispatcher import models
from dispatcher.store.queries import history


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
