"""The rules the dispatcher and the SDK's in-memory fake share live in SDK modules both import
(``bulk_rules``, ``schedule_rules``, ``validation``); where the node states one a second way (an
enum, a pydantic constraint), that way is pinned here to the shared one."""

from __future__ import annotations

import pydantic
import pytest

from consumers_sdk import bulk_rules, schedule_rules, validation
from dispatcher.api import schedule_schemas, schemas
from dispatcher.bulk import model as bulk
from dispatcher.recurring import model, occurrences


def node_accepts(annotation: object, value: object) -> bool:
    """Whether the API's request model takes ``value`` for a field of this type."""
    try:
        pydantic.TypeAdapter(annotation).validate_python(value)
    except pydantic.ValidationError:
        return False
    return True


def test_every_bulk_action_has_the_states_it_changes() -> None:
    assert set(bulk_rules.APPLIES_TO) == {action.value for action in bulk.Action}


def test_a_new_schedules_defaults_are_the_shared_ones() -> None:
    fields = schedule_schemas.ScheduleCreate.model_fields
    assert occurrences.Missed(schedule_rules.DEFAULT_MISSED) is occurrences.Missed.LATEST
    assert fields["missed"].default is occurrences.Missed.LATEST
    assert model.ScheduleSpec.__dataclass_fields__["missed"].default is occurrences.Missed.LATEST
    assert fields["grace_s"].default == schedule_rules.DEFAULT_GRACE_S
    assert fields["timezone"].default == schedule_rules.DEFAULT_TIMEZONE


@pytest.mark.parametrize(
    "name", ["nightly", "a.b:c-d_e", "x" * 128, "", "x" * 129, "with space", "tab\t", "ends\n"]
)
def test_a_schedule_name_is_refused_by_the_node_exactly_when_the_rule_refuses_it(
    name: str,
) -> None:
    accepted = node_accepts(schedule_schemas.Name, name)
    assert accepted is (schedule_rules.name_problem(name) is None)


@pytest.mark.parametrize("priority", [-1, 0, 5, 9, 10])
def test_a_priority_is_refused_by_the_node_exactly_when_the_rule_refuses_it(priority: int) -> None:
    accepted = node_accepts(schemas.Priority, priority)
    assert accepted is (validation.priority_problem(priority) is None)
