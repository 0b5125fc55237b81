"""The random ids of outcome events: version 4 UUIDs in canonical text, never repeated, and not
repeated by a child process made by fork() either (its copy of the pool would be its parent's)."""

from __future__ import annotations

import os
import uuid

from consumers_sdk import ids


def test_event_ids_are_canonical_version_4_uuids_and_all_differ() -> None:
    event_ids = ids.RandomIds()
    made = [event_ids.next_text() for _ in range(5 * ids.RANDOM_BLOCK // 16)]  # several pools
    assert len(set(made)) == len(made)
    for text in made:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_a_forked_child_draws_ids_of_its_own() -> None:
    event_ids = ids.RandomIds()
    event_ids.next_text()  # a pool drawn before the fork, which the child inherits
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only writes its next id and exits
        os.write(write_end, event_ids.next_text().encode())
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(child, 0)
    from_child = os.read(read_end, 64).decode()
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0
    assert uuid.UUID(from_child).version == 4
    assert from_child != event_ids.next_text()  # the parent's next id from the same pool
