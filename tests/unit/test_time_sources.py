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
