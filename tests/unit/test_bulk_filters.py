"""The checks of a bulk action's filter and change (``bulk``): what each action may change, and the
field a refusal names."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from consumers_sdk import bulk_rules
from dispatcher import errors
from dispatcher.bulk import model as bulk

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def refused_field(call: object) -> str:
    assert callable(call)
    with pytest.raises(errors.InvalidField) as refused:
        call()
    return refused.value.field


def test_each_action_changes_the_states_its_one_job_route_does() -> None:
    for action, states in [
        (bulk.Action.CANCEL, ("scheduled", "waiting")),
        (bulk.Action.RESCHEDULE, ("scheduled", "waiting")),
        (bulk.Action.REQUEUE, ("dead",)),
    ]:
        spec = bulk.check_filter(action, namespace="", scope_prefixes=None)
        assert spec.states == states
    narrowed = bulk.check_filter(
        bulk.Action.CANCEL, namespace="", scope_prefixes=None, state="waiting"
    )
    assert narrowed.states == ("waiting",)


def test_a_state_the_action_cannot_change_is_refused() -> None:
    for action, state in [
        (bulk.Action.CANCEL, "dispatching"),
        (bulk.Action.RESCHEDULE, "dead"),
        (bulk.Action.REQUEUE, "scheduled"),
    ]:
        field = refused_field(
            lambda a=action, s=state: bulk.check_filter(
                a, namespace=None, scope_prefixes=None, state=s
            )
        )
        assert field == "filter.state"


def test_ranges_must_be_in_order_and_finished_is_for_dead_jobs() -> None:
    later = NOW + timedelta(hours=1)
    assert (
        refused_field(
            lambda: bulk.check_filter(
                bulk.Action.CANCEL,
                namespace=None,
                scope_prefixes=None,
                run_at_from=later,
                run_at_to=NOW,
            )
        )
        == "filter.run_at_to"
    )
    assert (
        refused_field(
            lambda: bulk.check_filter(
                bulk.Action.CANCEL, namespace=None, scope_prefixes=None, finished_to=NOW
            )
        )
        == "filter.finished_to"
    )
    spec = bulk.check_filter(
        bulk.Action.REQUEUE,
        namespace=None,
        scope_prefixes=None,
        finished_from=NOW,
        finished_to=later,
    )
    assert (spec.finished_from, spec.finished_to) == (NOW, later)


def test_a_prefix_is_kept_as_its_words_and_must_be_a_routing_key() -> None:
    spec = bulk.check_filter(
        bulk.Action.CANCEL, namespace="", scope_prefixes=("billing",), routing_key_prefix="a.b."
    )
    assert (spec.routing_key_prefix, spec.scope_prefixes) == ("a.b", ("billing",))
    assert (
        refused_field(
            lambda: bulk.check_filter(
                bulk.Action.CANCEL, namespace="", scope_prefixes=None, routing_key_prefix="a b"
            )
        )
        == "filter.routing_key_prefix"
    )
    for text in ("", "x" * (bulk_rules.MAX_ERROR_TEXT + 1), "nul\x00"):
        assert (
            refused_field(
                lambda t=text: bulk.check_filter(
                    bulk.Action.REQUEUE, namespace="", scope_prefixes=None, error_contains=t
                )
            )
            == "filter.error_contains"
        )


def test_a_reschedule_takes_exactly_one_of_run_at_and_shift() -> None:
    def change(action: bulk.Action, **given: object) -> bulk.Change:
        return bulk.check_change(
            action,
            run_at=given.get("run_at"),  # type: ignore[arg-type]
            shift_s=given.get("shift_s"),  # type: ignore[arg-type]
            now=NOW,
            max_delay_days=10,
        )

    assert change(bulk.Action.RESCHEDULE, shift_s=-60.0) == bulk.Change(shift_s=-60.0)
    assert change(bulk.Action.RESCHEDULE, run_at=NOW) == bulk.Change(run_at=NOW)
    assert change(bulk.Action.CANCEL) == bulk.Change()
    for action, given, field in [
        (bulk.Action.RESCHEDULE, {}, "run_at"),
        (bulk.Action.RESCHEDULE, {"run_at": NOW, "shift_s": 1.0}, "run_at"),
        (bulk.Action.RESCHEDULE, {"shift_s": 0.0}, "shift_s"),
        (bulk.Action.RESCHEDULE, {"shift_s": float("nan")}, "shift_s"),
        (bulk.Action.RESCHEDULE, {"shift_s": 11 * 86400.0}, "shift_s"),
        (bulk.Action.RESCHEDULE, {"run_at": NOW + timedelta(days=11)}, "run_at"),
        (bulk.Action.REQUEUE, {"run_at": NOW}, "run_at"),
        (bulk.Action.CANCEL, {"shift_s": 5.0}, "shift_s"),
    ]:
        assert refused_field(lambda a=action, g=given: change(a, **g)) == field


def test_a_step_names_its_action() -> None:
    action_id = uuid.UUID(int=7)
    assert bulk_rules.detail(action_id, bulk.Action.REQUEUE) == f"bulk action {action_id}: requeue"


def test_times_are_kept_in_utc_and_one_utc_cannot_hold_is_refused() -> None:
    paris = timezone(timedelta(hours=1))
    spec = bulk.check_filter(
        bulk.Action.CANCEL,
        namespace=None,
        scope_prefixes=None,
        run_at_from=datetime(2026, 6, 1, 12, tzinfo=paris),
    )
    assert spec.run_at_from == datetime(2026, 6, 1, 11, tzinfo=UTC)
    earliest = datetime.min.replace(tzinfo=paris)  # year 1 at +01:00: before UTC's year 1
    assert (
        refused_field(
            lambda: bulk.check_filter(
                bulk.Action.REQUEUE, namespace=None, scope_prefixes=None, finished_to=earliest
            )
        )
        == "filter.finished_to"
    )
    assert (
        refused_field(
            lambda: bulk.check_change(
                bulk.Action.RESCHEDULE, run_at=earliest, shift_s=None, now=NOW, max_delay_days=10
            )
        )
        == "run_at"
    )
