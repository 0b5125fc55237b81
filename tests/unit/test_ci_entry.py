"""CI runs what the README tells a newcomer to run, nothing of its own: whatever the commands need
(packages, services, the browser) is installed by the Makefile, so the README's commands work on
a fresh machine exactly as in CI."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[2]


def ci_commands() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [
        line.strip()
        for line in lines
        if line.strip()
        and not line.lstrip().startswith("#")
        and not line.startswith(("set ", 'cd "$(dirname'))
    ]


def test_ci_calls_only_make_check_and_make_test() -> None:
    assert ci_commands() == ["make check", "make test"]


def test_the_readme_shows_both_commands_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make test" in quick_start
    assert "make check" in readme.split("## Development", 1)[1]
