"""The randomness in ids: outcome events' ids are version 4 UUIDs in canonical text, never
repeated; and neither they nor job ids are repeated by a child process made by fork() (its copy
of the random block would be its parent's)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest

from consumers_sdk import ids

FIXED_NS = 1_700_000_000_000_000_000  # parent and child in the same millisecond


def test_event_ids_are_canonical_version_4_uuids_and_all_differ() -> None:
    event_ids = ids.RandomIds()
    made = [event_ids.next_text() for _ in range(5 * ids.RANDOM_BLOCK // 16)]  # several blocks
    assert len(set(made)) == len(made)
    for text in made:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def _event_ids() -> Callable[[], str]:
    return ids.RandomIds().next_text


def _job_ids_on_a_stopped_clock() -> Callable[[], str]:
    job_ids = ids.JobIds(clock_ns=lambda: FIXED_NS)
    return lambda: str(job_ids.next())


@pytest.mark.parametrize("generator", [_event_ids, _job_ids_on_a_stopped_clock])
def test_a_forked_child_draws_ids_of_its_own(generator: Callable[[], Callable[[], str]]) -> None:
    next_id = generator()
    next_id()  # a block drawn before the fork, which the child inherits
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only writes its next id and exits
        os.write(write_end, next_id().encode())
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(child, 0)
    from_child = os.read(read_end, 64).decode()
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0
    uuid.UUID(from_child)
    assert from_child != next_id()  # the parent's next id, from the same generator state
