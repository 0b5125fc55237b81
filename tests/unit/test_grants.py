"""Grants (pure): a job a meter let go stays granted, by its id, until its grant runs out, which
is when the meter would ask for it again; whatever entry firing rebuilds for it."""

from __future__ import annotations

import uuid

from dispatcher.flow.grants import Grants

A, B, C = (uuid.UUID(int=n) for n in (1, 2, 3))


def test_a_grant_holds_for_its_time_then_runs_out() -> None:
    grants = Grants(keep_s=10.0)
    assert grants.granted([A], now_mono=0.0) == []
    grants.grant([A, B], now_mono=0.0)
    assert grants.granted([A, B, C], now_mono=9.9) == [A, B]
    assert grants.granted([A, B, C], now_mono=10.0) == []
    assert len(grants) == 0  # forgotten once run out


def test_granted_again_a_job_holds_from_its_new_grant() -> None:
    grants = Grants(keep_s=10.0)
    grants.grant([A, B], now_mono=0.0)
    grants.grant([A], now_mono=5.0)
    assert grants.granted([A, B], now_mono=12.0) == [A]
    assert grants.granted([A, B], now_mono=15.0) == []


def test_the_oldest_grants_go_first_past_the_cap() -> None:
    grants = Grants(keep_s=10.0, cap=2)
    grants.grant([A], now_mono=0.0)
    grants.grant([B, C], now_mono=1.0)
    assert grants.granted([A, B, C], now_mono=2.0) == [B, C]
