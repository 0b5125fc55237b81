"""The lock (constraints.txt) and the ranges the two pyproject.toml files declare agree: every
declared dependency is pinned within its range, the pinned aiormq and uvicorn are releases the
code that reaches into their internals was tested on, and the runtime installed here is the one
the lock pins (so CI runs what the lock says). `make lock` rewrites the lock."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from dispatcher.amqp.frames import TESTED_AIORMQ
from dispatcher.api.internals import TESTED_UVICORN

ROOT = Path(__file__).parents[2]
SERVICE = tomllib.loads((ROOT / "pyproject.toml").read_text())
SDK = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())
# Installed from the repository itself (editable), never from the lock.
OWN = {canonicalize_name(SERVICE["project"]["name"]), canonicalize_name(SDK["project"]["name"])}


def locked() -> dict[NormalizedName, Version]:
    """constraints.txt's pins by canonical name; every line not a comment is one `name==version`."""
    pins: dict[NormalizedName, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", line
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"{name} pinned twice"
        pins[name] = Version(specifier.version)
    return pins


def declared() -> list[tuple[str, Requirement]]:
    """Every requirement the service and the SDK declare, with where it is declared."""
    found = [("dependencies", Requirement(line)) for line in SERVICE["project"]["dependencies"]]
    for group, entries in SERVICE["dependency-groups"].items():
        # An {include-group = ...} entry is checked as the group it names.
        found += [(f"group {group}", Requirement(e)) for e in entries if isinstance(e, str)]
    found += [("sdk dependencies", Requirement(line)) for line in SDK["project"]["dependencies"]]
    for extra, lines in SDK["project"]["optional-dependencies"].items():
        found += [(f"sdk extra {extra}", Requirement(line)) for line in lines]
    return [
        (where, requirement)
        for where, requirement in found
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""})
    ]


def runtime_versions() -> dict[NormalizedName, str]:
    """The installed version of every distribution the service's runtime pulls in (its
    dependencies, theirs, and so on, markers and extras evaluated as pip would here)."""
    versions: dict[NormalizedName, str] = {}
    visited: set[tuple[NormalizedName, str]] = set()
    pending = [Requirement(line) for line in SERVICE["project"]["dependencies"]]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        for extra in ("", *sorted(requirement.extras)):
            if (name, extra) in visited:
                continue
            visited.add((name, extra))
            distribution = metadata.distribution(name)
            versions[name] = distribution.version
            for line in distribution.requires or []:
                needed = Requirement(line)
                if needed.marker is None or needed.marker.evaluate({"extra": extra}):
                    pending.append(needed)
    return versions


def test_the_lock_pins_neither_the_projects_own_distributions_nor_pip() -> None:
    assert not {*OWN, "pip"} & set(locked())


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    pins = locked()
    wrong = []
    for where, requirement in declared():
        name = canonicalize_name(requirement.name)
        if name in OWN:
            continue
        pin = pins.get(name)
        if pin is None or not requirement.specifier.contains(pin, prereleases=True):
            wrong.append(f"{where}: {requirement} locked at {pin}")
    assert wrong == [], "run make lock, or move the range"


def test_the_locked_aiormq_and_uvicorn_are_the_releases_tested_with_their_internals() -> None:
    pins = locked()
    low, high = TESTED_AIORMQ
    assert low <= pins[canonicalize_name("aiormq")].release <= high
    assert pins[canonicalize_name("uvicorn")] == Version(TESTED_UVICORN)


def test_the_installed_runtime_is_the_locked_one() -> None:
    pins = locked()
    installed = {name: Version(v) for name, v in runtime_versions().items() if name not in OWN}
    assert "uvicorn" in installed
    assert {name: pins.get(name) for name in installed} == installed, (
        "this venv is not the lock's: make venv (it reinstalls when constraints.txt changes)"
    )
