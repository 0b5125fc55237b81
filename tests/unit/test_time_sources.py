"""No component of the dispatcher reads the host's wall clock by default: a node's clock is not a
time source (a broken NTP would move it), so each takes the node's time from whoever builds it.
Only the timekeeper reads the wall clock, to measure it against PostgreSQL's; the command line
runs beside no node."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dispatcher"
WALL_CLOCKS = {"time.time", "time.time_ns", "datetime.now", "datetime.utcnow"}
ALLOWED = {"timekeeper.py"}  # measures the wall clock against PostgreSQL's


def wall_clock_reads(tree: ast.AST) -> list[int]:
    """Lines that name a wall clock: a parameter's default, or a call."""
    found = []
    for node in ast.walk(tree):
        named = node.func if isinstance(node, ast.Call) else node
        if (
            isinstance(named, ast.Attribute)
            and isinstance(named.value, ast.Name)
            and f"{named.value.id}.{named.attr}" in WALL_CLOCKS
        ):
            found.append(named.lineno)
    return sorted(set(found))


def test_no_component_reads_the_hosts_wall_clock_but_the_timekeeper() -> None:
    offenders = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] == "cli" or relative.name in ALLOWED:
            continue
        lines = wall_clock_reads(ast.parse(path.read_text()))
        if lines:
            offenders[str(relative)] = lines
    assert offenders == {}


def test_the_check_finds_a_default_and_a_call() -> None:
    code = "def f(clock=time.time):\n    return datetime.now(UTC)\n"
    assert wall_clock_reads(ast.parse(code)) == [1, 2]


# Each kind of time has one name (``dispatcher.timing.kinds``): the parameter that takes it.
KIND_NAMES = {
    "NodeTime": "now",
    "NodeDate": "now_dt",
    "Mono": "mono",
    "Wall": "wall",
    "NodeClock": "timekeeper",
}
UNNAMED_KINDS = {"Callable[[], float]", "Callable[[], datetime]"}


def time_parameters(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, name, annotation) of every parameter and field that takes a time source."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            name, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name, annotation = node.target.id, node.annotation
        else:
            continue
        text = ast.unparse(annotation)
        if text in KIND_NAMES or text in UNNAMED_KINDS:
            found.append((node.lineno, name, text))
    return found


def test_each_kind_of_time_has_one_type_and_one_name() -> None:
    """A time source is typed by its kind, never a bare ``Callable[[], float]`` that could be any
    of three, and the parameter taking it is named as its kind says."""
    offenders = {}
    seen = set()
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] == "cli":
            continue
        for line, name, kind in time_parameters(ast.parse(path.read_text())):
            seen.add(kind)
            if KIND_NAMES.get(kind) != name:
                offenders[f"{relative}:{line}"] = f"{name}: {kind}"
    assert seen >= set(KIND_NAMES)
    assert offenders == {}
