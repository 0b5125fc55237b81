"""No two test files share a name: the test folders are not packages, so pytest imports each file
as a top-level module by its name, and a second file of the same name fails to import."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parents[1]


def test_every_test_file_name_is_unique() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
