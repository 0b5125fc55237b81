"""The layout tree of the docs (docs/development/layout.md) matches the code: every folder and
module it names exists, and every package and module of the dispatcher and the SDK is named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def tree() -> list[str]:
    page = (ROOT / "docs" / "development" / "layout.md").read_text()
    return page.split("```", 2)[1].strip("\n").splitlines()


def named_paths() -> set[Path]:
    """Folders (``name/``) and modules (``name.py``) named in the tree. An indented line's names
    live in the folder of the last line indented less; names after a folder on its own line
    (``tests/  unit/ e2e/``) live in that folder."""
    paths: set[Path] = set()
    parents: list[tuple[int, Path]] = []
    for line in tree():
        indent = len(line) - len(line.lstrip())
        parents = [(depth, folder) for depth, folder in parents if depth < indent]
        base = parents[-1][1] if parents else Path()
        for word in line.split():
            if not re.fullmatch(r"[\w.]+\.py|\w+/", word):
                break  # the description starts
            path = base / word.rstrip("/")
            paths.add(path)
            if word.endswith("/") and word == line.split()[0]:
                parents.append((indent, path))
                base = path
    return paths


def test_every_path_the_layout_names_exists() -> None:
    paths = named_paths()
    assert Path("dispatcher/firing/firer.py") in paths
    assert len(paths) > 40
    missing = sorted(str(path) for path in paths if not (ROOT / path).exists())
    assert missing == []


def test_every_package_and_module_is_named_in_the_layout() -> None:
    code = {
        path.parent if path.name == "__init__.py" else path
        for top in ("dispatcher", "consumers_sdk", "devstack")
        for path in (ROOT / top).rglob("*.py")
        if path.name != "__main__.py"
    }
    assert ROOT / "dispatcher/amqp" in code
    assert (
        sorted(str(path.relative_to(ROOT)) for path in code - {ROOT / p for p in named_paths()})
        == []
    )


def test_the_benchmarks_and_devstack_never_import_the_tests() -> None:
    """One launcher: the benchmarks start nodes and services through devstack, as the tests do,
    never through the test suite's own helpers."""
    importing = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for folder in ("bench", "devstack")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in path.read_text().splitlines()
        if re.match(r"\s*(from|import) tests\b", line)
    ]
    assert importing == []
