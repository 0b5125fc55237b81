"""The oldest snapshot holding vacuum back: its age, from PostgreSQL's word or from how long the
node has seen it, and the warning past the setting."""

from __future__ import annotations

from dispatcher.upkeep.vacuum_horizon import Holder, Horizon, Look


def session(held_s: float, xmin: str = "900", xmin_age: int = 5000) -> Holder:
    return Holder(
        kind="session",
        name="pid 41 (nightly-report, idle in transaction)",
        xmin=xmin,
        xmin_age=xmin_age,
        held_s=held_s,
    )


def slot(xmin: str, xmin_age: int = 100) -> Holder:
    return Holder(
        kind="replication slot", name="standby_1", xmin=xmin, xmin_age=xmin_age, held_s=None
    )


def test_nothing_held_is_no_warning() -> None:
    horizon = Horizon(warn_after_s=600)
    horizon.saw(Look(holders=[], sees_all_sessions=True), now=0.0)
    assert horizon.oldest is None
    assert not horizon.held_back
    assert horizon.describe() == {
        "held_back": False,
        "oldest_snapshot_s": None,
        "warn_after_s": 600,
        "sees_all_sessions": True,
    }


def test_a_session_past_the_setting_is_a_warning_that_names_it() -> None:
    horizon = Horizon(warn_after_s=600)
    horizon.saw(Look(holders=[session(held_s=599.0)], sees_all_sessions=True), now=0.0)
    assert not horizon.held_back
    horizon.saw(Look(holders=[session(held_s=601.0)], sees_all_sessions=True), now=2.0)
    assert horizon.held_back
    assert horizon.describe() == {
        "held_back": True,
        "oldest_snapshot_s": 601.0,
        "warn_after_s": 600,
        "sees_all_sessions": True,
        "xmin_age": 5000,
        "holder": "session pid 41 (nightly-report, idle in transaction)",
    }


def test_a_slot_ages_from_when_the_node_first_saw_it_hold_that_xmin() -> None:
    horizon = Horizon(warn_after_s=600)
    horizon.saw(Look(holders=[slot("900")], sees_all_sessions=True), now=100.0)
    assert horizon.oldest is not None
    assert horizon.oldest.age_s == 0.0
    horizon.saw(Look(holders=[slot("900")], sees_all_sessions=True), now=800.0)
    assert horizon.held_back  # the same xmin for 700 s
    horizon.saw(Look(holders=[slot("1500")], sees_all_sessions=True), now=810.0)
    assert not horizon.held_back  # it moved on: a newer xmin starts again
    assert horizon.oldest is not None
    assert horizon.oldest.age_s == 0.0


def test_the_oldest_by_age_is_the_one_shown() -> None:
    horizon = Horizon(warn_after_s=600)
    # The slot holds the older xmin, but the session has been open longer.
    look = Look(holders=[slot("800", xmin_age=9000), session(held_s=30.0)], sees_all_sessions=False)
    horizon.saw(look, now=0.0)
    assert horizon.oldest is not None
    assert horizon.oldest.holder.kind == "session"
    assert horizon.describe()["sees_all_sessions"] is False


def test_a_holder_that_went_away_is_forgotten() -> None:
    horizon = Horizon(warn_after_s=600)
    horizon.saw(Look(holders=[slot("900")], sees_all_sessions=True), now=0.0)
    horizon.saw(Look(holders=[], sees_all_sessions=True), now=700.0)
    horizon.saw(Look(holders=[slot("900")], sees_all_sessions=True), now=701.0)
    assert not horizon.held_back
