"""Intake's batch rules, without I/O."""

from __future__ import annotations

import pytest

from dispatcher.intake import service as intake


@pytest.mark.parametrize(
    ("keys", "repeated"),
    [
        ([], None),
        (["a", "b", None, None], None),  # jobs without a key never repeat one
        (["a", "b", "a"], (2, 0)),
        ([None, "k", "x", "k", "k", "x"], (3, 1)),  # the first repeat, and where the key was
    ],
)
def test_a_batch_names_each_idempotency_key_once(
    keys: list[str | None], repeated: tuple[int, int] | None
) -> None:
    assert intake.repeated_key(keys) == repeated
